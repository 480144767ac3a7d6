/* npy.h -- reading and writing numpy .npy files (C11; hidetc-run's helper, not installed).
 *
 * Reads format versions 1.0, 2.0 and 3.0 (the header is a Python dict literal with
 * 'descr', 'fortran_order' and 'shape'); writes version 1.0 with the header padded so
 * the data starts 64-byte aligned, as numpy does. The data of an array read is held in a
 * 64-byte aligned buffer (at least 64 bytes even when the array is empty).
 *
 * Only plain dtypes are understood: a descr "<f4", "|u1", "|V2"... (byte order, kind,
 * item size); a structured descr (a list) or an object dtype is refused.
 */
#ifndef HIDETC_NPY_H
#define HIDETC_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_RANK 64

typedef struct npy_array {
    char descr[32];          /* as written in the header, e.g. "<f4" */
    char byteorder;          /* '<', '>', '|' or '=' */
    char kind;               /* 'f', 'i', 'u', 'b', 'V', 'c', ... */
    size_t itemsize;
    int fortran_order;
    int rank;
    int64_t shape[NPY_MAX_RANK];
    size_t count;            /* elements */
    size_t nbytes;           /* count * itemsize */
    void *data;              /* 64-byte aligned; npy_free releases it */
} npy_array;

/* Read `path` into `out`. 0 on success; else -1 with a one-line message in err. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);
void npy_free(npy_array *array);

/* Parse a descr string ("<f4") into byte order, kind and item size. 0: ok. */
int npy_parse_descr(const char *descr, char *byteorder, char *kind, size_t *itemsize);

/* Write an array (C order) to `path` directly (no temporary). 0 on success; else -1 with
   a message in err (the partial file is removed). */
int npy_write(const char *path, const char *descr, int rank, const int64_t *shape,
              const void *data, size_t nbytes, char *err, size_t errlen);

#endif
