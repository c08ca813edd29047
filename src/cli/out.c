/* SPDX-License-Identifier: MIT */
/*
 * out.c -- how the commands print lock names and holders: for people (odd
 * bytes made visible) and as JSON strings (always valid JSON, whatever the
 * bytes).
 *
 * A lock name is any bytes but NUL (dlock.h). Printed raw, a name with a
 * newline breaks a table and a name with a byte that is not UTF-8 breaks
 * a JSON parser, so every command prints names through these.
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
        size_t n = cli_utf8_len(p);

        if (n > 1) {
            fwrite(p, 1, n, f);
            p += n;
            continue;
        }
        if (*p == '\\')
            fputs("\\\\", f);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
        p++;
    }
}

size_t cli_human_width(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t w = 0;

    while (*p) {
        size_t n = cli_utf8_len(p);

        if (n > 1) {
            w++; /* one column for most characters; close enough here */
            p += n;
            continue;
        }
        w += *p == '\\' ? 2 : (*p < 0x20 || *p >= 0x7f) ? 4 : 1;
        p++;
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
