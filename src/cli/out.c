/* SPDX-License-Identifier: MIT */
/*
 * out.c -- how the commands print lock names and holders: for people (odd
 * bytes made visible) and as JSON strings (always valid JSON, whatever the
 * bytes).
 *
 * A lock name is any bytes but NUL (dlock.h). Printed raw, a name with a
 * newline breaks a table and a name with a byte that is not UTF-8 breaks
 * a JSON parser, so every command prints names through these.
 *
 * The same goes for every other string that came from a store or a
 * server (holder descriptions, error text, the wait queue): whoever can
 * write the store chooses those bytes, and printed raw, an escape
 * sequence in them retitles or clears the operator's terminal, or writes
 * a fake line. So nothing such reaches a terminal unescaped: esc_next()
 * below decides, for people (cli_human_str, cli_escape, cli_err) and for
 * JSON (cli_json_str) alike, what is printed as is.
 */
#include "cli.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at p (1..4), or 0 if p
 * starts none: the table of the Unicode standard (3.9, "Well-Formed UTF-8
 * Byte Sequences"), so no overlong forms, no surrogates, nothing past
 * U+10FFFF. ASCII counts (1); NUL never occurs (C strings). */
size_t cli_utf8_len(const unsigned char *p)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xbf;
    size_t n;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    /* the second byte's range narrows for these lead bytes */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0; /* also stops at the NUL */
    return n;
}

/* The code point of the well-formed UTF-8 sequence of n bytes at p. */
static unsigned utf8_cp(const unsigned char *p, size_t n)
{
    unsigned cp = n == 2 ? p[0] & 0x1fu : n == 3 ? p[0] & 0x0fu : p[0] & 0x07u;

    for (size_t i = 1; i < n; i++)
        cp = cp << 6 | (p[i] & 0x3fu);
    return cp;
}

/* A character a terminal acts on rather than shows: the C1 controls
 * (U+0080..U+009F, which some terminals obey when UTF-8 encoded: U+009B is
 * CSI) and the bidirectional overrides and isolates, which reorder what
 * follows on the line. */
static int invisible_cp(unsigned cp)
{
    return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

/* The next unit of s at p for people: *len bytes of p consumed; returns 1
 * when they are printed as they are, else 0 with their escaped form in
 * esc (NUL-terminated): a control byte, DEL, a byte that starts no
 * well-formed UTF-8 sequence, and the invisible characters above as \xNN
 * (each byte), a backslash as \\ when `backslash`. */
static int esc_next(const unsigned char *p, int backslash, size_t *len,
                    char esc[16])
{
    size_t n = cli_utf8_len(p);

    if (n > 1) {
        *len = n;
        if (!invisible_cp(utf8_cp(p, n)))
            return 1;
        char *o = esc;
        for (size_t i = 0; i < n; i++, o += 4)
            snprintf(o, 5, "\\x%02x", p[i]);
        return 0;
    }
    *len = 1;
    if (*p == '\\' && backslash) {
        strcpy(esc, "\\\\");
        return 0;
    }
    if (*p < 0x20 || *p >= 0x7f) {
        snprintf(esc, 16, "\\x%02x", *p);
        return 0;
    }
    return 1;
}

size_t cli_escape(char *dst, size_t cap, const char *s, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)s;
    int backslash = (flags & CLI_ESC_BACKSLASH) != 0;
    size_t at = 0;

    if (cap == 0)
        return 0;
    while (*p) {
        char esc[16];
        size_t n, olen;
        const char *out = esc;
        if (esc_next(p, backslash, &n, esc)) {
            out = (const char *)p;
            olen = n;
        } else {
            olen = strlen(esc);
        }
        if (at + olen >= cap)
            break; /* whole units only */
        memcpy(dst + at, out, olen);
        at += olen;
        p += n;
    }
    dst[at] = '\0';
    return at;
}

int cli_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p) {
        size_t n = cli_utf8_len(p);
        if (n == 0)
            return 0;
        p += n;
    }
    return 1;
}

void cli_json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    fputc('"', f);
    while (*p) {
        unsigned char ch = *p;
        size_t n = cli_utf8_len(p);

        if (n > 1) {
            unsigned cp = utf8_cp(p, n);
            if (invisible_cp(cp))
                fprintf(f, "\\u%04x", cp); /* the same character */
            else
                fwrite(p, 1, n, f);
            p += n;
            continue;
        }
        switch (ch) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            /* control characters, DEL, and a byte that starts no UTF-8
             * sequence (n == 0): the code point of the same number */
            if (ch < 0x20 || ch >= 0x7f)
                fprintf(f, "\\u%04x", ch);
            else
                fputc(ch, f);
        }
        p++;
    }
    fputc('"', f);
}

void cli_json_name(FILE *f, const char *key, const char *s)
{
    fprintf(f, "\"%s\":", key);
    cli_json_str(f, s);
    if (!cli_utf8_valid(s)) {
        /* the JSON string above is readable but not exact (a byte 0xE9
         * and the character U+00E9 both read as "\u00e9"): the bytes */
        fprintf(f, ",\"%s_hex\":\"", key);
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
            fprintf(f, "%02x", *p);
        fputc('"', f);
    }
}

void cli_human_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p) {
        char esc[16];
        size_t n;
        if (esc_next(p, 1, &n, esc))
            fwrite(p, 1, n, f);
        else
            fputs(esc, f);
        p += n;
    }
}

void cli_term_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p) {
        char esc[16];
        size_t n;
        if (esc_next(p, 0, &n, esc))
            fwrite(p, 1, n, f);
        else
            fputs(esc, f);
        p += n;
    }
}

size_t cli_human_width(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t w = 0;

    while (*p) {
        char esc[16];
        size_t n;
        /* one column for most characters; close enough here */
        w += esc_next(p, 1, &n, esc) ? 1 : strlen(esc);
        p += n;
    }
    return w;
}

const char *cli_mode_of(const dlock_info *info)
{
    if (info->permits > 0)
        return "semaphore";
    if (!info->held)
        return "free";
    return info->shared ? "shared" : "exclusive";
}

void cli_json_info(FILE *f, const dlock_info *info)
{
    fprintf(f, "\"held\":%s,\"holder\":", info->held ? "true" : "false");
    if (info->held)
        cli_json_str(f, info->holder);
    else
        fputs("null", f);
    fprintf(f, ",\"mode\":\"%s\",\"holders\":%lld,\"permits\":%lld",
            cli_mode_of(info), (long long)info->holders,
            (long long)info->permits);
    fprintf(f,
            ",\"token\":%llu,\"held_ms\":%lld,\"ttl_ms\":%lld,"
            "\"waiters\":%lld,\"queue\":[",
            (unsigned long long)info->token, (long long)info->held_ms,
            (long long)info->ttl_ms, (long long)info->waiters);
    for (size_t i = 0; i < info->queue_len; i++) {
        if (i)
            fputc(',', f);
        cli_json_str(f, info->queue[i]);
    }
    fputc(']', f);
    if (info->foreign[0]) {
        fputs(",\"foreign\":", f);
        cli_json_str(f, info->foreign);
    }
}
