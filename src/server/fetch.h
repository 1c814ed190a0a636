/* Fetching the http(s) URL of an image or audio part of a chat request (libcurl, curl.se/libcurl/c).
 *
 * Contract: srv_fetch(url, ...) returns the body of a 2xx reply to GET url, or -1 with a one-line reason.
 * Only http:// and https:// are requested, on every hop; redirects are followed one by one (at most
 * max_redirects), each new URL checked (scheme, host) before it is requested; a host outside a non-empty
 * allowed_domains list is never contacted, and unless allow_private a connection to an address that is not public
 * (loopback, private, link-local, carrier-grade NAT, multicast, unspecified; IPv4-mapped IPv6 as its IPv4) is
 * refused before anything is sent, on every hop, after the name is resolved (so a public name that resolves to
 * an internal address is refused too). The whole fetch, redirects included, ends after timeout_s; a body
 * (or a Content-Length) over max_bytes ends it at once. cancelled(user), polled while the transfer runs, stops
 * it (the client has left, the server stops). libcurl's proxy variables (http_proxy, https_proxy, no_proxy)
 * apply. Nothing is decoded here: the caller hands the bytes to the same decoders as a data URL's. It blocks the
 * calling thread (the request's connection thread), never the engine's. srv_fetch_global_init must run once
 * before any thread fetches (srv_main does); srv_fetch_global_cleanup at exit. */
#ifndef G4_SERVER_FETCH_H
#define G4_SERVER_FETCH_H

#include <stddef.h>

typedef struct srv_fetch_limits {
    size_t max_bytes;            /* the body's size at most (--max-media-bytes) */
    int timeout_s;               /* the whole fetch (--media-fetch-timeout) */
    int max_redirects;           /* redirects followed at most; 0: none (--media-max-redirects) */
    const char *allowed_domains; /* NULL or "": any host; else host names separated by commas, each compared with
                                  * the URL's host whole and without case (--allowed-media-domains) */
    int allow_private;           /* 1: addresses that are not public may be contacted (--allow-private-media-hosts) */
} srv_fetch_limits;

int srv_fetch_global_init(void);
void srv_fetch_global_cleanup(void);

/* The body of url into *out (malloc'ed, *len bytes; free it). Returns 0, or -1 with msg filled (one line). */
int srv_fetch(const char *url, const srv_fetch_limits *lim, int (*cancelled)(void *user), void *user,
              unsigned char **out, size_t *len, char *msg, size_t msg_cap);

#endif
