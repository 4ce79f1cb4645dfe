//! Figures measured once over IPv4 and once over IPv6, kept in one flat
//! JSON object: IPv4's under their own keys, IPv6's under the same keys
//! with `_ipv6` after them (`mb_per_s`, `mb_per_s_ipv6`), as results.json
//! has had them since the IPv6 runs were added.

use serde::de::{DeserializeOwned, Error as _};
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

const SUFFIX: &str = "_ipv6";

/// One set of figures per address family: a struct per family in Rust,
/// one flat object in JSON (the module doc). `ipv6` is `None` when no key
/// has the suffix (a contender that relays IPv4 only).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerFamily<T> {
    pub ipv4: T,
    pub ipv6: Option<T>,
}

impl<T: Serialize> Serialize for PerFamily<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let object = |t: &T| match serde_json::to_value(t).map_err(S::Error::custom)? {
            Value::Object(m) => Ok(m),
            other => Err(S::Error::custom(format!(
                "a family's figures are an object, not {other}"
            ))),
        };
        let mut all = object(&self.ipv4)?;
        if let Some(ipv6) = &self.ipv6 {
            let suffixed = object(ipv6)?.into_iter();
            all.extend(suffixed.map(|(k, v)| (format!("{k}{SUFFIX}"), v)));
        }
        all.serialize(s)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for PerFamily<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (mut ipv4, mut ipv6) = (Map::new(), Map::new());
        for (k, v) in Map::<String, Value>::deserialize(d)? {
            match k.strip_suffix(SUFFIX) {
                Some(bare) => ipv6.insert(bare.to_string(), v),
                None => ipv4.insert(k, v),
            };
        }
        let parse = |m: Map<String, Value>| {
            serde_json::from_value(Value::Object(m)).map_err(D::Error::custom)
        };
        Ok(PerFamily {
            ipv4: parse(ipv4)?,
            ipv6: (!ipv6.is_empty()).then(|| parse(ipv6)).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
    #[serde(default)]
    struct Runs {
        mb_per_s: Vec<f64>,
    }

    #[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
    #[serde(default)]
    struct Summary {
        #[serde(flatten)]
        runs: PerFamily<Runs>,
        bytes: u64,
    }

    #[test]
    fn ipv6_figures_are_the_same_keys_with_the_suffix_beside_ipv4s() {
        let both = Summary {
            runs: PerFamily {
                ipv4: Runs {
                    mb_per_s: vec![500.0],
                },
                ipv6: Some(Runs {
                    mb_per_s: vec![450.0],
                }),
            },
            bytes: 7,
        };
        let v = serde_json::to_value(&both).unwrap();
        assert_eq!(
            v,
            json!({"mb_per_s": [500.0], "mb_per_s_ipv6": [450.0], "bytes": 7})
        );
        assert_eq!(serde_json::from_value::<Summary>(v).unwrap(), both);
        let ipv4_only: Summary = serde_json::from_value(json!({"mb_per_s": [1.0]})).unwrap();
        assert_eq!(ipv4_only.runs.ipv6, None);
        assert_eq!(ipv4_only.runs.ipv4.mb_per_s, [1.0]);
    }
}
