/* npy.c -- numpy .npy reading and writing for hidetc-run (see npy.h). */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPY_MAX_HEADER (1u << 20)   /* numpy itself refuses headers over 10000 bytes */
#define NPY_ALIGN 64

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; ++p)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

int npy_parse_descr(const char *descr, char *byteorder, char *kind, size_t *itemsize)
{
    if (!descr || !descr[0] || !descr[1] || !descr[2]) return -1;
    char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=') return -1;
    char k = descr[1];
    if (!((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z'))) return -1;
    size_t size = 0;
    const char *p = descr + 2;
    if (*p < '0' || *p > '9') return -1;
    for (; *p; ++p) {
        if (*p < '0' || *p > '9') return -1;
        if (size > 100000) return -1;
        size = size * 10 + (size_t)(*p - '0');
    }
    if (size == 0) return -1;
    if (byteorder) *byteorder = order;
    if (kind) *kind = k;
    if (itemsize) *itemsize = size;
    return 0;
}

/* ---- the header: a Python dict literal ------------------------------------------- */

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        ++c->p;
}

/* a quoted string ('...' or "...", no escapes needed for our keys and descrs) */
static int parse_string(cursor *c, char *buf, size_t buflen)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return -1;
    char quote = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != quote) {
        if (*c->p == '\\') return -1;
        if (n + 1 >= buflen) return -1;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return -1;
    ++c->p;
    buf[n] = '\0';
    return 0;
}

static int parse_word(cursor *c, const char *word)
{
    skip_ws(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return -1;
    const char *after = c->p + n;
    if (after < c->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                           (*after >= '0' && *after <= '9') || *after == '_'))
        return -1;
    c->p = after;
    return 0;
}

static int parse_shape(cursor *c, npy_array *a, char *err, size_t errlen)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p != '(') {
        set_err(err, errlen, "'shape' is not a tuple");
        return -1;
    }
    ++c->p;
    a->rank = 0;
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == ')') { ++c->p; return 0; }
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
            set_err(err, errlen, "'shape' is not a tuple of non-negative integers");
            return -1;
        }
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (INT64_MAX - 9) / 10) {
                set_err(err, errlen, "a dimension in 'shape' is too large");
                return -1;
            }
            v = v * 10 + (*c->p - '0');
            ++c->p;
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) ++c->p;   /* Python 2 longs */
        if (a->rank >= NPY_MAX_RANK) {
            set_err(err, errlen, "'shape' has more than %d dimensions", NPY_MAX_RANK);
            return -1;
        }
        a->shape[a->rank++] = v;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') { ++c->p; continue; }
        if (c->p < c->end && *c->p == ')') { ++c->p; break; }
        set_err(err, errlen, "'shape' is not a tuple of integers");
        return -1;
    }
    return 0;   /* "(3)" (an int in Python) is read as "(3,)" */
}

static int parse_header(const char *text, size_t len, npy_array *a, char *err, size_t errlen)
{
    cursor c = {text, text + len};
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') {
        set_err(err, errlen, "the header is not a dict");
        return -1;
    }
    ++c.p;
    for (;;) {
        skip_ws(&c);
        if (c.p < c.end && *c.p == '}') { ++c.p; break; }
        char key[32];
        if (parse_string(&c, key, sizeof key) != 0) {
            set_err(err, errlen, "the header's keys are not 'descr', 'fortran_order', 'shape'");
            return -1;
        }
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') {
            set_err(err, errlen, "the header is not a dict");
            return -1;
        }
        ++c.p;
        if (strcmp(key, "descr") == 0 && !have_descr) {
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[') {
                set_err(err, errlen, "structured dtypes are not supported");
                return -1;
            }
            if (parse_string(&c, a->descr, sizeof a->descr) != 0 ||
                npy_parse_descr(a->descr, &a->byteorder, &a->kind, &a->itemsize) != 0) {
                set_err(err, errlen, "unsupported 'descr' in the header");
                return -1;
            }
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            if (parse_word(&c, "True") == 0) a->fortran_order = 1;
            else if (parse_word(&c, "False") == 0) a->fortran_order = 0;
            else {
                set_err(err, errlen, "'fortran_order' is not True or False");
                return -1;
            }
            have_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (parse_shape(&c, a, err, errlen) != 0) return -1;
            have_shape = 1;
        } else {
            set_err(err, errlen, "unexpected or repeated key '%s' in the header", key);
            return -1;
        }
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') { ++c.p; continue; }
        if (c.p < c.end && *c.p == '}') { ++c.p; break; }
        set_err(err, errlen, "the header is not a dict");
        return -1;
    }
    skip_ws(&c);
    while (c.p < c.end && *c.p == '\0') ++c.p;   /* tolerate NUL padding */
    if (c.p != c.end) {
        set_err(err, errlen, "text after the header's dict");
        return -1;
    }
    if (!have_descr || !have_fortran || !have_shape) {
        set_err(err, errlen, "the header lacks '%s'",
                !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
        return -1;
    }
    return 0;
}

void npy_free(npy_array *array)
{
    if (!array) return;
    free(array->data);
    array->data = NULL;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char *header = NULL;
    int rc = -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[12];
    size_t got = fread(pre, 1, 8, f);
    if (got < 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        if (ferror(f)) set_err(err, errlen, "%s: %s", path, strerror(errno));
        else set_err(err, errlen, "%s: not a .npy file", path);
        goto done;
    }
    unsigned major = pre[6], minor = pre[7];
    size_t hlen;
    if (major == 1 && minor == 0) {
        if (fread(pre + 8, 1, 2, f) != 2) {
            set_err(err, errlen, "%s: truncated .npy header", path);
            goto done;
        }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (fread(pre + 8, 1, 4, f) != 4) {
            set_err(err, errlen, "%s: truncated .npy header", path);
            goto done;
        }
        uint32_t v = (uint32_t)pre[8] | ((uint32_t)pre[9] << 8) | ((uint32_t)pre[10] << 16) |
                     ((uint32_t)pre[11] << 24);
        if (v > NPY_MAX_HEADER) {
            set_err(err, errlen, "%s: .npy header of %u bytes is too large", path, (unsigned)v);
            goto done;
        }
        hlen = v;
    } else {
        set_err(err, errlen, "%s: unsupported .npy format version %u.%u", path, major, minor);
        goto done;
    }
    header = malloc(hlen + 1);
    if (!header) {
        set_err(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (fread(header, 1, hlen, f) != hlen) {
        set_err(err, errlen, "%s: truncated .npy header", path);
        goto done;
    }
    header[hlen] = '\0';
    char perr[200];
    if (parse_header(header, hlen, out, perr, sizeof perr) != 0) {
        set_err(err, errlen, "%s: bad .npy header: %s", path, perr);
        goto done;
    }
    if (out->kind == 'O') {
        set_err(err, errlen, "%s: object arrays are not supported", path);
        goto done;
    }
    size_t count = 1;
    for (int i = 0; i < out->rank; ++i) {
        uint64_t d = (uint64_t)out->shape[i];
        if (d != 0 && count > SIZE_MAX / d) {
            set_err(err, errlen, "%s: the array is too large", path);
            goto done;
        }
        count *= (size_t)d;
    }
    if (out->itemsize != 0 && count > SIZE_MAX / out->itemsize / 2) {
        set_err(err, errlen, "%s: the array is too large", path);
        goto done;
    }
    out->count = count;
    out->nbytes = count * out->itemsize;
    size_t alloc = (out->nbytes + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    if (alloc == 0) alloc = NPY_ALIGN;
    out->data = aligned_alloc(NPY_ALIGN, alloc);
    if (!out->data) {
        set_err(err, errlen, "%s: out of memory for %zu bytes", path, out->nbytes);
        goto done;
    }
    if (alloc > out->nbytes) memset((char *)out->data + out->nbytes, 0, alloc - out->nbytes);
    got = fread(out->data, 1, out->nbytes, f);
    if (got != out->nbytes) {
        if (ferror(f)) set_err(err, errlen, "%s: %s", path, strerror(errno));
        else set_err(err, errlen, "%s: truncated: %zu bytes of data, the header says %zu",
                     path, got, out->nbytes);
        goto done;
    }
    if (fgetc(f) != EOF) {
        set_err(err, errlen, "%s: more data than the header's shape holds", path);
        goto done;
    }
    rc = 0;
done:
    free(header);
    fclose(f);
    if (rc != 0) npy_free(out);
    return rc;
}

int npy_write(const char *path, const char *descr, int rank, const int64_t *shape,
              const void *data, size_t nbytes, char *err, size_t errlen)
{
    if (rank < 0 || rank > NPY_MAX_RANK || strlen(descr) > 16) {
        set_err(err, errlen, "%s: bad array to write", path);
        return -1;
    }
    char dict[64 + NPY_MAX_RANK * 24];
    size_t n = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                                descr);
    for (int i = 0; i < rank; ++i)
        n += (size_t)snprintf(dict + n, sizeof dict - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", rank == 1 ? "," : "");
    if (rank > 0) {
        /* numpy leaves room for the first dimension to grow to 21 digits in place */
        int digits = snprintf(NULL, 0, "%lld", (long long)shape[0]);
        for (int i = digits; i < 21 && n + 1 < sizeof dict; ++i) dict[n++] = ' ';
        dict[n] = '\0';
    }
    /* magic(6) version(2) length(2) dict padding '\n': a multiple of 64 */
    size_t total = 10 + n + 1;
    size_t padded = (total + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t hlen = padded - 10;                 /* < 65536: the rank is bounded */
    unsigned char head[10 + sizeof dict + NPY_ALIGN];
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (unsigned char)(hlen & 0xff);
    head[9] = (unsigned char)(hlen >> 8);
    memcpy(head + 10, dict, n);
    memset(head + 10 + n, ' ', hlen - n - 1);
    head[padded - 1] = '\n';

    FILE *f = fopen(path, "wbx");   /* C11: fails if the file exists */
    if (!f) {
        int e = errno;
        set_err(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return e == EEXIST ? -2 : -1;
    }
    int ok = fwrite(head, 1, padded, f) == padded &&
             (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
    int e = errno;
    if (fclose(f) != 0 && ok) { ok = 0; e = errno; }
    if (!ok) {
        set_err(err, errlen, "%s: %s", path, strerror(e));
        remove(path);
        return -1;
    }
    return 0;
}
