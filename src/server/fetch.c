/* Fetching media URLs with libcurl (fetch.h): one easy handle per fetch, redirects followed by hand so that
 * every hop's scheme and host are checked before it is requested. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "server/fetch.h"

int srv_fetch_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1; }

void srv_fetch_global_cleanup(void) { curl_global_cleanup(); }

static int say(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *msg, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* The scheme and host of an absolute URL (curl's parser, so that "http://a.com@b.org/" is b.org's), malloc'ed by
 * curl; -1 when it is no URL. */
static int url_parts(const char *url, char **scheme, char **host) {
    *scheme = *host = NULL;
    CURLU *u = curl_url();
    int rc = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
                     curl_url_get(u, CURLUPART_SCHEME, scheme, 0) == CURLUE_OK &&
                     curl_url_get(u, CURLUPART_HOST, host, 0) == CURLUE_OK
                 ? 0
                 : -1;
    curl_url_cleanup(u);
    if (rc) curl_free(*scheme), curl_free(*host), *scheme = *host = NULL;
    return rc;
}

static int host_in_list(const char *host, const char *list) {
    if (!list || !*list) return 1;
    const size_t n = strlen(host);
    for (const char *p = list; *p;) {
        p += strspn(p, ", ");
        const size_t k = strcspn(p, ", ");
        if (k == n && k && !strncasecmp(p, host, n)) return 1;
        p += k;
    }
    return 0;
}

/* Is this hop's URL one we may request? 0, or -1 with msg. */
static int check_hop(const char *url, const srv_fetch_limits *lim, char *msg, size_t cap) {
    char *scheme, *host;
    if (url_parts(url, &scheme, &host)) return say(msg, cap, "'%.200s' is not a valid URL", url);
    int rc = 0;
    if (strcmp(scheme, "http") && strcmp(scheme, "https"))
        rc = say(msg, cap, "'%.200s': only http and https URLs are fetched", url);
    else if (!host_in_list(host, lim->allowed_domains))
        rc = say(msg, cap, "the host '%.100s' is not in this server's --allowed-media-domains", host);
    curl_free(scheme);
    curl_free(host);
    return rc;
}

/* 1 when ip (text, as curl reports the address it connected to) is not a public address: IPv4 0/8, 10/8,
 * 100.64/10, 127/8, 169.254/16, 172.16/12, 192.0.0/24, 192.168/16, 198.18/15, 224/3 and 255.255.255.255; IPv6
 * ::, ::1, fc00::/7, fe80::/10, ff00::/8 and an IPv4-mapped or -compatible address by its IPv4 (RFC 6890's
 * special-purpose registries). An address that does not parse counts as not public. */
static int ipv4_private(const unsigned char *a) {
    return a[0] == 0 || a[0] == 10 || a[0] == 127 || a[0] >= 224 || (a[0] == 100 && (a[1] & 0xc0) == 64) ||
           (a[0] == 169 && a[1] == 254) || (a[0] == 172 && (a[1] & 0xf0) == 16) ||
           (a[0] == 192 && a[1] == 0 && a[2] == 0) || (a[0] == 192 && a[1] == 168) ||
           (a[0] == 198 && (a[1] & 0xfe) == 18);
}
static int address_private(const char *ip) {
    unsigned char a[16];
    if (inet_pton(AF_INET, ip, a) == 1) return ipv4_private(a);
    if (inet_pton(AF_INET6, ip, a) != 1) return 1;
    static const unsigned char zero[12] = {0}, mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(a, mapped, 12) || !memcmp(a, zero, 12)) return ipv4_private(a + 12); /* (:: and ::1 are 0.0.0.x) */
    return (a[0] & 0xfe) == 0xfc || (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) || a[0] == 0xff;
}

/* curl's last word before a request goes out on a connection: refuse addresses that are not public */
static int on_connected(void *arg, char *ip, char *local_ip, int port, int local_port) {
    (void)local_ip, (void)port, (void)local_port;
    char *refused = arg;
    if (!address_private(ip)) return CURL_PREREQFUNC_OK;
    snprintf(refused, 64, "%s", ip);
    return CURL_PREREQFUNC_ABORT;
}

typedef struct body {
    unsigned char *p;
    size_t len, cap, max;
    int too_big;
    int (*cancelled)(void *);
    void *user;
    int gone;
} body;

static size_t on_data(char *data, size_t size, size_t n, void *arg) {
    body *b = arg;
    n *= size;
    if (n > b->max - b->len) { /* (b->len <= b->max always) */
        b->too_big = 1;
        return 0; /* curl ends the transfer with CURLE_WRITE_ERROR */
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n) cap *= 2;
        if (cap > b->max) cap = b->max;
        unsigned char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return n;
}

static int on_progress(void *arg, curl_off_t dl_total, curl_off_t dl_now, curl_off_t ul_total, curl_off_t ul_now) {
    (void)dl_total, (void)dl_now, (void)ul_total, (void)ul_now;
    body *b = arg;
    return b->cancelled && (b->gone = b->cancelled(b->user)); /* non-zero: curl aborts */
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int srv_fetch(const char *url, const srv_fetch_limits *lim, int (*cancelled)(void *user), void *user,
              unsigned char **out, size_t *len, char *msg, size_t cap) {
    *out = NULL;
    *len = 0;
    CURL *h = curl_easy_init();
    if (!h) return say(msg, cap, "out of memory");
    body b = {.max = lim->max_bytes, .cancelled = cancelled, .user = user};
    char errbuf[CURL_ERROR_SIZE], refused[64] = "";
    char *hop = strdup(url);
    const double deadline = now_s() + lim->timeout_s;
    int rc = -1;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)lim->max_bytes);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "gemma4c");
    if (!lim->allow_private) {
        curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, on_connected);
        curl_easy_setopt(h, CURLOPT_PREREQDATA, refused);
    }
    for (int redirects = 0; hop;) {
        if (check_hop(hop, lim, msg, cap)) break;
        const double left = deadline - now_s();
        if (left <= 0) {
            say(msg, cap, "timed out after %d s (--media-fetch-timeout)", lim->timeout_s);
            break;
        }
        curl_easy_setopt(h, CURLOPT_URL, hop);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(left * 1000) + 1);
        b.len = 0;
        errbuf[0] = 0;
        const CURLcode cc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (cc == CURLE_FILESIZE_EXCEEDED || b.too_big) {
            say(msg, cap, "the body is larger than %zu bytes (--max-media-bytes)", lim->max_bytes);
            break;
        }
        if (cc == CURLE_OPERATION_TIMEDOUT) {
            say(msg, cap, "timed out after %d s (--media-fetch-timeout)", lim->timeout_s);
            break;
        }
        if (cc == CURLE_ABORTED_BY_CALLBACK && refused[0]) {
            say(msg, cap, "the host resolves to %s, which is not a public address (--allow-private-media-hosts "
                          "lets this server fetch from it)", refused);
            break;
        }
        if (cc == CURLE_ABORTED_BY_CALLBACK && b.gone) {
            say(msg, cap, "cancelled (the client left, or the server stops)");
            break;
        }
        if (cc != CURLE_OK) {
            say(msg, cap, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
            break;
        }
        if (status >= 300 && status < 400) {
            char *next = NULL;
            curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &next);
            if (!next) {
                say(msg, cap, "HTTP %ld without a Location", status);
                break;
            }
            if (redirects++ >= lim->max_redirects) {
                say(msg, cap, "more than %d redirects (--media-max-redirects)", lim->max_redirects);
                break;
            }
            free(hop);
            hop = strdup(next); /* (next is the handle's, gone at the next perform) */
            continue;
        }
        if (status < 200 || status >= 300) {
            say(msg, cap, "HTTP %ld", status);
            break;
        }
        if (b.len == 0) {
            say(msg, cap, "the body is empty");
            break;
        }
        *out = b.p, *len = b.len;
        b.p = NULL;
        rc = 0;
        break;
    }
    if (!hop) say(msg, cap, "out of memory");
    free(hop);
    free(b.p);
    curl_easy_cleanup(h);
    return rc;
}
