/* Template text -> tokens, following jinja2's lexer with trim_blocks=True and lstrip_blocks=True:
 * - the source's line breaks (\r\n, \r, \n) become \n and one trailing newline is dropped;
 * - "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all after;
 * - a block or comment tag that ends with "%}" / "#}" swallows one newline right after it
 *   ("+%}" keeps it);
 * - a block or comment tag preceded on its line by whitespace only loses that whitespace
 *   ("{%+" keeps it);
 * - inside a tag, the end marker only counts while brackets are balanced. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "jinja/jinja_internal.h"

typedef struct {
    const char *src;
    size_t n, pos;
    int line;
    int line_starting;
    jarena *arena;
    jtokens *out;
    g4_error *err;
} lexer;

static int emit(lexer *L, jtok_kind kind, int line, const char *s, size_t len) {
    jtokens *t = L->out;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        jtok *p = realloc(t->items, cap * sizeof *p);
        if (!p) return g4_fail(L->err, "template: out of memory");
        t->items = p;
        t->cap = cap;
    }
    jtok *k = &t->items[t->n++];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->line = line;
    if (s) {
        k->s = jarena_strndup(L->arena, s, len);
        if (!k->s) return g4_fail(L->err, "template: out of memory");
        k->len = len;
    }
    return 0;
}

static int count_newlines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Skips whitespace at pos (Python's \s*); returns 1 when the last skipped char is '\n'. */
static int skip_ws(lexer *L) {
    size_t k = ju8_lspace(L->src + L->pos, L->n - L->pos);
    int nl = k > 0 && L->src[L->pos + k - 1] == '\n';
    L->line += count_newlines(L->src + L->pos, k);
    L->pos += k;
    return nl;
}

static int starts(const lexer *L, size_t at, const char *s) {
    size_t k = strlen(s);
    return at + k <= L->n && memcmp(L->src + at, s, k) == 0;
}

/* Text before a tag, with the tag's whitespace control applied. */
static int emit_text(lexer *L, size_t from, size_t to, char sign, int lstrip_ok) {
    const char *text = L->src + from;
    size_t len = to - from;
    int line = L->line;
    if (sign == '-') {
        len -= ju8_rspace(text, len);
    } else if (sign != '+' && lstrip_ok) {
        size_t l_pos = 0;
        for (size_t i = len; i > 0; i--)
            if (text[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || L->line_starting) && l_pos < len &&
            ju8_lspace(text + l_pos, len - l_pos) == len - l_pos)
            len = l_pos;
    }
    L->line += count_newlines(L->src + from, to - from);
    if (len == 0) return 0;
    return emit(L, T_DATA, line, text, len);
}

static int lex_fail(lexer *L, const char *fmt, const char *what) {
    return g4_fail(L->err, "template line %d: %s%s", L->line, fmt, what ? what : "");
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* (\d+_)*\d+ at p; returns the end or p when none. */
static size_t digits_us(const char *s, size_t n, size_t p) {
    size_t q = p;
    if (q >= n || !is_digit(s[q])) return p;
    while (q < n) {
        if (is_digit(s[q])) {
            q++;
        } else if (s[q] == '_' && q + 1 < n && is_digit(s[q + 1])) {
            q++;
        } else {
            break;
        }
    }
    return q;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int lex_number(lexer *L) {
    const char *s = L->src;
    size_t n = L->n, p = L->pos;
    int line = L->line;
    /* float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+) */
    if (!(p > 0 && s[p - 1] == '.')) {
        size_t q = digits_us(s, n, p), end = 0;
        size_t frac = q;
        if (q < n && s[q] == '.') {
            size_t r = digits_us(s, n, q + 1);
            if (r > q + 1) frac = r;
        }
        if (frac < n && (s[frac] == 'e' || s[frac] == 'E')) {
            size_t r = frac + 1;
            if (r < n && (s[r] == '+' || s[r] == '-')) r++;
            size_t e = digits_us(s, n, r);
            if (e > r) end = e;
        }
        if (!end && frac > q) end = frac;
        if (end) {
            char tmp[128];
            size_t k = 0;
            for (size_t i = p; i < end && k + 1 < sizeof tmp; i++)
                if (s[i] != '_') tmp[k++] = s[i];
            tmp[k] = 0;
            if (emit(L, T_FLOAT, line, NULL, 0)) return -1;
            L->out->items[L->out->n - 1].f = strtod(tmp, NULL);
            L->pos = end;
            return 0;
        }
    }
    /* integer: 0b(_?[01])+ | 0o(_?[0-7])+ | 0x(_?[0-9a-f])+ | [1-9](_?\d)* | 0(_?0)* */
    int base = 10;
    size_t q = p;
    if (s[p] == '0' && p + 2 < n) {
        char c = (char)(s[p + 1] | 0x20);
        int b = c == 'b' ? 2 : c == 'o' ? 8 : c == 'x' ? 16 : 0;
        size_t r = p + 2;
        if (b && r < n && s[r] == '_') r++;
        if (b && r < n && hexval(s[r]) >= 0 && hexval(s[r]) < b) {
            base = b;
            q = p + 2;
        }
    }
    uint64_t v = 0;
    size_t ndig = 0;
    int zero_run = base == 10 && s[p] == '0';
    while (q < n) {
        size_t r = q;
        if (s[r] == '_' && (ndig > 0 || base != 10)) r++;
        int d = r < n ? hexval(s[r]) : -1;
        if (d < 0 || d >= base || (zero_run && d != 0)) break;
        if (v > ((uint64_t)INT64_MAX - (uint64_t)d) / (uint64_t)base)
            return lex_fail(L, "integer literal too large", NULL);
        v = v * (uint64_t)base + (uint64_t)d;
        ndig++;
        q = r + 1;
    }
    if (ndig == 0) return lex_fail(L, "invalid number literal", NULL);
    if (emit(L, T_INT, line, NULL, 0)) return -1;
    L->out->items[L->out->n - 1].i = (int64_t)v;
    L->pos = q;
    return 0;
}

static int lex_string(lexer *L) {
    const char *s = L->src;
    size_t n = L->n, p = L->pos;
    char q = s[p];
    int line = L->line;
    size_t i = p + 1;
    jbuf b = {0};
    while (1) {
        if (i >= n) {
            jbuf_free(&b);
            return g4_fail(L->err, "template line %d: unterminated string literal", line);
        }
        char c = s[i];
        if (c == q) break;
        if (c != '\\') {
            jbuf_putc(&b, c);
            i++;
            continue;
        }
        if (i + 1 >= n) {
            i++;
            continue;
        }
        char e = s[i + 1];
        i += 2;
        switch (e) {
        case '\n':
            break;
        case '\\':
        case '\'':
        case '"':
            jbuf_putc(&b, e);
            break;
        case 'a':
            jbuf_putc(&b, '\a');
            break;
        case 'b':
            jbuf_putc(&b, '\b');
            break;
        case 'f':
            jbuf_putc(&b, '\f');
            break;
        case 'n':
            jbuf_putc(&b, '\n');
            break;
        case 'r':
            jbuf_putc(&b, '\r');
            break;
        case 't':
            jbuf_putc(&b, '\t');
            break;
        case 'v':
            jbuf_putc(&b, '\v');
            break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i < n ? hexval(s[i]) : -1;
                if (h < 0) {
                    jbuf_free(&b);
                    return g4_fail(L->err, "template line %d: truncated \\%c escape in string",
                                   line, e);
                }
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF) {
                jbuf_free(&b);
                return g4_fail(L->err, "template line %d: invalid \\U escape in string", line);
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
            ju8_put(&b, cp);
            break;
        }
        case 'N':
            jbuf_free(&b);
            return g4_fail(L->err, "template line %d: \\N{...} escapes are not supported", line);
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++, i++)
                    cp = cp * 8 + (uint32_t)(s[i] - '0');
                ju8_put(&b, cp);
            } else { /* unknown escape: kept as written */
                jbuf_putc(&b, '\\');
                jbuf_putc(&b, e);
            }
        }
    }
    L->line += count_newlines(s + p, i + 1 - p);
    L->pos = i + 1;
    if (b.failed) {
        jbuf_free(&b);
        return g4_fail(L->err, "template: out of memory");
    }
    int rc = emit(L, T_STRING, line, b.p ? b.p : "", b.len);
    jbuf_free(&b);
    return rc;
}

static const char *const operators[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*",
                                         "%",  "~",  "[",  "]",  "(",  ")",  "{", "}", ">", "<",
                                         "=",  ".",  ":",  "|",  ",",  ";"};

/* Lexes the inside of a {% %} (block) or {{ }} tag up to and including its end. */
static int lex_tag(lexer *L, int block) {
    char stack[256];
    int depth = 0;
    int open_line = L->line;
    while (1) {
        if (L->pos >= L->n)
            return g4_fail(L->err, "template line %d: unexpected end of template, '%s' not closed",
                           open_line, block ? "{%" : "{{");
        size_t p = L->pos;
        if (depth == 0) {
            if (block) {
                if (starts(L, p, "+%}")) {
                    L->pos += 3;
                    L->line_starting = 0;
                    return emit(L, T_BLOCK_END, L->line, NULL, 0);
                }
                if (starts(L, p, "-%}")) {
                    int line = L->line;
                    L->pos += 3;
                    L->line_starting = skip_ws(L);
                    return emit(L, T_BLOCK_END, line, NULL, 0);
                }
                if (starts(L, p, "%}")) {
                    int line = L->line;
                    L->pos += 2;
                    L->line_starting = 0;
                    if (L->pos < L->n && L->src[L->pos] == '\n') {
                        L->pos++;
                        L->line++;
                        L->line_starting = 1;
                    }
                    return emit(L, T_BLOCK_END, line, NULL, 0);
                }
            } else {
                if (starts(L, p, "-}}")) {
                    int line = L->line;
                    L->pos += 3;
                    L->line_starting = skip_ws(L);
                    return emit(L, T_VAR_END, line, NULL, 0);
                }
                if (starts(L, p, "}}")) {
                    L->pos += 2;
                    L->line_starting = 0;
                    return emit(L, T_VAR_END, L->line, NULL, 0);
                }
            }
        }
        char c = L->src[p];
        size_t ws = ju8_lspace(L->src + p, L->n - p);
        if (ws) {
            skip_ws(L);
            continue;
        }
        if (is_digit(c)) {
            if (lex_number(L)) return -1;
            continue;
        }
        if (is_name_start(c)) {
            size_t q = p;
            while (q < L->n && is_name_char(L->src[q])) q++;
            if (emit(L, T_NAME, L->line, L->src + p, q - p)) return -1;
            L->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        const char *op = NULL;
        for (size_t k = 0; k < sizeof operators / sizeof operators[0]; k++)
            if (starts(L, p, operators[k])) {
                op = operators[k];
                break;
            }
        if (!op) {
            char what[8] = {c, 0};
            if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7F) snprintf(what, sizeof what, "\\x%02x", (unsigned char)c);
            return lex_fail(L, "unexpected character in tag: ", what);
        }
        if (op[1] == 0 && (c == '(' || c == '[' || c == '{')) {
            if (depth >= (int)sizeof stack) return lex_fail(L, "brackets nested too deeply", NULL);
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (op[1] == 0 && (c == ')' || c == ']' || c == '}')) {
            if (depth == 0) {
                char what[4] = {'\'', c, '\'', 0};
                return lex_fail(L, "unexpected ", what);
            }
            char want = stack[--depth];
            if (want != c) {
                char what[32];
                snprintf(what, sizeof what, "'%c', expected '%c'", c, want);
                return lex_fail(L, "unexpected ", what);
            }
        }
        if (emit(L, T_OP, L->line, op, strlen(op))) return -1;
        L->pos += strlen(op);
    }
}

/* {% raw %}: sets *end_len to the length of the raw-begin tag at pos (0 if none). */
static size_t raw_begin_len(const lexer *L, size_t at) {
    size_t p = at + 2;
    if (p < L->n && (L->src[p] == '-' || L->src[p] == '+')) p++;
    p += ju8_lspace(L->src + p, L->n - p);
    if (!starts(L, p, "raw")) return 0;
    p += 3;
    p += ju8_lspace(L->src + p, L->n - p);
    if (starts(L, p, "-%}")) {
        p += 3;
        p += ju8_lspace(L->src + p, L->n - p);
        return p - at;
    }
    if (starts(L, p, "%}")) return p + 2 - at;
    return 0;
}

static int lex_raw_body(lexer *L) {
    int open_line = L->line;
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        if (L->src[p] != '{' || L->src[p + 1] != '%') continue;
        size_t q = p + 2;
        char sign = 0;
        if (q < L->n && (L->src[q] == '-' || L->src[q] == '+')) sign = L->src[q++];
        q += ju8_lspace(L->src + q, L->n - q);
        if (!starts(L, q, "endraw")) continue;
        q += 6;
        q += ju8_lspace(L->src + q, L->n - q);
        size_t end;
        int trail_nl = 0;
        if (starts(L, q, "+%}")) {
            end = q + 3;
        } else if (starts(L, q, "-%}")) {
            end = q + 3;
            size_t k = ju8_lspace(L->src + end, L->n - end);
            trail_nl = k > 0 && L->src[end + k - 1] == '\n';
            end += k;
        } else if (starts(L, q, "%}")) {
            end = q + 2;
            if (end < L->n && L->src[end] == '\n') {
                end++;
                trail_nl = 1;
            }
        } else {
            continue;
        }
        if (emit_text(L, L->pos, p, sign, 1)) return -1;
        L->line += count_newlines(L->src + p, end - p);
        L->pos = end;
        L->line_starting = trail_nl;
        return 0;
    }
    return g4_fail(L->err, "template line %d: missing end of raw directive", open_line);
}

int jinja_lex(const char *src0, size_t len0, jarena *arena, jtokens *out, g4_error *err) {
    /* normalize line breaks and drop one trailing newline */
    char *src = malloc(len0 + 1);
    if (!src) return g4_fail(err, "template: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len0; i++) {
        if (src0[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len0 && src0[i + 1] == '\n') i++;
        } else {
            src[n++] = src0[i];
        }
    }
    if (n > 0 && src[n - 1] == '\n') n--;
    src[n] = 0;

    lexer L = {.src = src, .n = n, .pos = 0, .line = 1, .line_starting = 1, .arena = arena,
               .out = out, .err = err};
    int rc = 0;
    while (L.pos < L.n && rc == 0) {
        size_t t = L.pos;
        while (t + 1 < L.n && !(L.src[t] == '{' && (L.src[t + 1] == '{' || L.src[t + 1] == '%' ||
                                                      L.src[t + 1] == '#')))
            t++;
        if (t + 1 >= L.n) { /* no more tags: the rest is text */
            rc = emit(&L, T_DATA, L.line, L.src + L.pos, L.n - L.pos);
            L.line += count_newlines(L.src + L.pos, L.n - L.pos);
            L.pos = L.n;
            break;
        }
        char kind = L.src[t + 1];
        char sign = 0;
        if (t + 2 < L.n && (L.src[t + 2] == '-' || L.src[t + 2] == '+')) sign = L.src[t + 2];
        size_t raw = kind == '%' ? raw_begin_len(&L, t) : 0;
        if (emit_text(&L, L.pos, t, sign, kind != '{')) {
            rc = -1;
            break;
        }
        if (raw) {
            L.line += count_newlines(L.src + t, raw);
            L.pos = t + raw;
            L.line_starting = L.src[L.pos - 1] == '\n';
            rc = lex_raw_body(&L);
            continue;
        }
        L.pos = t + 2 + (sign ? 1 : 0);
        L.line_starting = 0;
        if (kind == '#') {
            int open_line = L.line;
            size_t p = L.pos;
            while (p + 1 < L.n && !(L.src[p] == '#' && L.src[p + 1] == '}')) p++;
            if (p + 1 >= L.n) {
                rc = g4_fail(err, "template line %d: missing end of comment tag", open_line);
                break;
            }
            char end_sign = p > L.pos ? L.src[p - 1] : 0;
            L.line += count_newlines(L.src + L.pos, p - L.pos);
            L.pos = p + 2;
            if (end_sign == '-') {
                L.line_starting = skip_ws(&L);
            } else if (end_sign != '+' && L.pos < L.n && L.src[L.pos] == '\n') {
                L.pos++;
                L.line++;
                L.line_starting = 1;
            }
            continue;
        }
        int block = kind == '%';
        rc = emit(&L, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, L.line, NULL, 0);
        if (rc == 0) rc = lex_tag(&L, block);
    }
    if (rc == 0) rc = emit(&L, T_EOF, L.line, NULL, 0);
    free(src);
    return rc;
}
