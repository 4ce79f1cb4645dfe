//! The peers' configuration files, written for each run from its setup:
//! nginx's and HAProxy's, ingress and the egress relay.

use super::*;

/// An upstream or backend name for actor number `i`.
pub(super) fn backend_name(i: usize) -> String {
    format!("actor_{i}")
}

/// nginx: one worker process, access log off, HTTP/2 and HTTP/1.1 with
/// client certificates required, a `map` from `ate-target-actor` to one
/// upstream per actor with a keep-alive pool.
pub(super) fn nginx_conf(s: &PeerSetup) -> String {
    let dir = s.dir.display();
    let temp = s.dir.join("nginx-temp");
    let temp = temp.display();
    let mut c = String::new();
    let _ = write!(
        c,
        "# Written by atunnel-bench (--compare peers): nginx in atunnel's place.\n\
         worker_processes 1;\n\
         daemon off;\n\
         pid {dir}/nginx.pid;\n\
         error_log stderr warn;\n\
         events {{\n    worker_connections {MAX_CONNS};\n}}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   server_tokens off;\n\
         \x20   client_body_temp_path {temp}/body;\n\
         \x20   proxy_temp_path {temp}/proxy;\n\
         \x20   fastcgi_temp_path {temp}/fastcgi;\n\
         \x20   uwsgi_temp_path {temp}/uwsgi;\n\
         \x20   scgi_temp_path {temp}/scgi;\n\
         \x20   # Router connections: kept while idle, never closed for a request count.\n\
         \x20   keepalive_timeout {CLIENT_IDLE_SECS}s;\n\
         \x20   keepalive_requests 1000000000;\n\
         \x20   client_header_timeout 10s;\n\
         \x20   http2_max_concurrent_streams {MAX_CONCURRENT_STREAMS};\n\
         \x20   ssl_protocols TLSv1.2 TLSv1.3;\n\
         \x20   # The router makes full handshakes (as atunnel sees it): no resumption state.\n\
         \x20   ssl_session_cache off;\n\
         \x20   ssl_session_tickets off;\n\
         \x20   map $http_ate_target_actor $actor_upstream {{\n\
         \x20       default \"\";\n"
    );
    for (i, b) in s.backends.iter().enumerate() {
        let _ = writeln!(c, "        \"{}\" {};", b.actor, backend_name(i));
    }
    c.push_str("    }\n");
    for (i, b) in s.backends.iter().enumerate() {
        let _ = write!(
            c,
            "    upstream {} {{\n\
             \x20       server {};\n\
             \x20       keepalive {UPSTREAM_IDLE_PER_ACTOR};\n\
             \x20       keepalive_timeout {UPSTREAM_IDLE_SECS}s;\n\
             \x20       keepalive_requests 1000000000;\n\
             \x20   }}\n",
            backend_name(i),
            b.addr,
        );
    }
    let _ = write!(
        c,
        "    server {{\n\
         \x20       listen {listen} ssl http2 backlog=4096;\n\
         \x20       ssl_certificate {cert};\n\
         \x20       ssl_certificate_key {cert};\n\
         \x20       ssl_client_certificate {ca};\n\
         \x20       ssl_verify_client on;\n\
         \x20       location / {{\n\
         \x20           if ($actor_upstream = \"\") {{\n\
         \x20               add_header X-Ate-Assignment-Stale true always;\n\
         \x20               return 421;\n\
         \x20           }}\n\
         \x20           proxy_pass http://$actor_upstream;\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_set_header Host $host;\n\
         \x20           proxy_set_header ate-target-actor \"\";\n\
         \x20           proxy_set_header X-Ate-Target-Port \"\";\n\
         \x20           proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         \x20           proxy_set_header X-Forwarded-Proto https;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n",
        listen = s.listen,
        cert = s.cert_bundle.display(),
        ca = s.client_ca.display(),
    );
    c
}

/// HAProxy: one thread, no logging, HTTP/2 and HTTP/1.1 with client
/// certificates required, one ACL and backend per actor, idle server
/// connections reused by any request (`http-reuse always`: the backends
/// are the actors' own servers).
pub(super) fn haproxy_cfg(s: &PeerSetup) -> String {
    let mut c = String::new();
    let _ = write!(
        c,
        "# Written by atunnel-bench (--compare peers): HAProxy in atunnel's place.\n\
         global\n\
         \x20   nbthread 1\n\
         \x20   maxconn {MAX_CONNS}\n\
         \x20   tune.h2.max-concurrent-streams {MAX_CONCURRENT_STREAMS}\n\
         \x20   ssl-default-bind-options ssl-min-ver TLSv1.2\n\
         \x20   # The router makes full handshakes (as atunnel sees it): no resumption state.\n\
         \x20   tune.ssl.cachesize 0\n"
    );
    if s.egress.is_some() {
        // The relay's client sockets are the sandbox side: fixed buffers,
        // as atunnel's sandbox-side sockets have. HAProxy 2.6 sets them
        // for every client socket, the router's too (autotuned in
        // atunnel), which the ingress units' 64 B answers do not fill.
        let _ = write!(
            c,
            "\x20   # Client sockets' buffers fixed, as atunnel's sandbox-side sockets are.\n\
             \x20   tune.rcvbuf.client {SANDBOX_BUFFER}\n\
             \x20   tune.sndbuf.client {SANDBOX_BUFFER}\n"
        );
    }
    let _ = write!(
        c,
        "\n\
         defaults\n\
         \x20   mode http\n\
         \x20   # No log line per request (atunnel writes none either).\n\
         \x20   no log\n\
         \x20   timeout connect 5s\n\
         \x20   timeout http-request 10s\n\
         \x20   # Router connections: kept while idle.\n\
         \x20   timeout client {CLIENT_IDLE_SECS}s\n\
         \x20   timeout http-keep-alive {CLIENT_IDLE_SECS}s\n\
         \x20   timeout server 60s\n\
         \x20   option http-keep-alive\n\
         \x20   http-reuse always\n\
         \n\
         frontend ingress\n\
         \x20   bind {listen} ssl crt {cert} ca-file {ca} verify required alpn h2,http/1.1 no-tls-tickets\n",
        listen = s.listen,
        cert = s.cert_bundle.display(),
        ca = s.client_ca.display(),
    );
    for (i, backend) in s.backends.iter().enumerate() {
        let b = backend_name(i);
        let name = &backend.actor;
        let _ = writeln!(c, "    acl {b} req.hdr(ate-target-actor) -m str {name}");
        let _ = writeln!(c, "    use_backend {b} if {b}");
    }
    c.push_str(
        "    default_backend stale\n\
         \n\
         backend stale\n\
         \x20   http-request return status 421 hdr X-Ate-Assignment-Stale true\n",
    );
    for (i, backend) in s.backends.iter().enumerate() {
        let b = backend_name(i);
        let addr = backend.addr;
        // From inside the sandbox's gateway namespace, as atunnel dials.
        let netns = match &backend.netns {
            Some(ns) => format!(" namespace {ns}"),
            None => String::new(),
        };
        let _ = write!(
            c,
            "\nbackend {b}\n\
             \x20   http-request del-header ate-target-actor\n\
             \x20   http-request del-header X-Ate-Target-Port\n\
             \x20   option forwardfor\n\
             \x20   server {b} {addr}{netns} pool-max-conn {UPSTREAM_IDLE_PER_ACTOR} pool-purge-delay {UPSTREAM_IDLE_SECS}s\n"
        );
    }
    if let Some(e) = &s.egress {
        haproxy_egress(&mut c, e);
    }
    c
}

/// The egress relay's sections: its own defaults (TCP), one frontend per
/// sandbox, one backend to the TLS far end.
pub(super) fn haproxy_egress(c: &mut String, e: &EgressRelay) {
    let ca = e.ca.display();
    let name = &e.server_name;
    let _ = write!(
        c,
        "\n# Egress: a TCP -> TLS relay in each sandbox, where its redirect delivers the\n\
         # actor's TCP; the far end's port is the original destination's (SO_ORIGINAL_DST)\n\
         # plus {offset}.\n\
         defaults egress\n\
         \x20   mode tcp\n\
         \x20   no log\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client {CLIENT_IDLE_SECS}s\n\
         \x20   timeout server {CLIENT_IDLE_SECS}s\n\
         \n\
         backend egress_far_end\n\
         \x20   server far_end {far}:+{offset} ssl verify required ca-file {ca} sni str({name}) verifyhost {name}\n",
        offset = e.port_offset,
        far = e.far_end,
    );
    for (i, ns) in e.netns.iter().enumerate() {
        // IPv4: HAProxy reads SO_ORIGINAL_DST for IPv4 sockets only.
        let _ = write!(
            c,
            "\nfrontend egress_actor_{i}\n\
             \x20   bind 0.0.0.0:{port} namespace {ns}\n\
             \x20   default_backend egress_far_end\n",
            port = e.port,
        );
    }
}
