/* safetensors.h — read (mmap) and write safetensors files, and open sharded HF models.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"k": "v"}}
 * then the raw little-endian tensor bytes; offsets are relative to the end of the header.
 *
 * Reading never trusts the file: every length, offset, shape and dtype is checked, and a
 * corrupt or truncated file yields an error string, never an out-of-bounds access. The data
 * stays in the mapping; st_tensor_to_f32 converts F32/BF16/F16 to fp32 on the way out.
 *
 * Writing is streaming (st_write_stream): the header is computed from the descriptors,
 * then a callback fills one tensor at a time, so multi-GB files (mkmodel of a real-size
 * model) never need all tensors in memory at once. The header follows the conventions the
 * cookbook and PEFT expect: "__metadata__": {"format": "pt"}, padded with spaces to a
 * multiple of 8, offsets contiguous from 0 in descriptor order.
 */
#ifndef LOOM_MODEL_SAFETENSORS_H
#define LOOM_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_DTYPE_COUNT
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;          /* owned by the st_file */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;       /* inside the mapping; may be unaligned */
    size_t nbytes;
} st_tensor;

typedef struct st_file st_file;

/* Name ("F32", "BF16", ...) and element size of a dtype; st_dtype_parse returns -1 if unknown. */
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);
int st_dtype_parse(const char *s, st_dtype *out);

/* Open a file (mmap, read-only) or parse a caller's buffer (kept by reference: it must
 * outlive the st_file). Both return 0, or -1 with a message in err. */
int st_open(const char *path, st_file **out, char *err, size_t errlen);
int st_open_mem(const void *buf, size_t len, st_file **out, char *err, size_t errlen);
void st_close(st_file *f);

int st_count(const st_file *f);
const st_tensor *st_get(const st_file *f, int i);            /* header order */
const st_tensor *st_find(const st_file *f, const char *name); /* NULL if absent */
/* Value of a "__metadata__" string entry, or NULL. */
const char *st_metadata(const st_file *f, const char *key);

/* Convert a tensor of a float dtype (F32, BF16, F16, F64) to fp32 into dst, which holds
 * exactly t->numel floats. -1 with err for non-float dtypes or a count mismatch. */
int st_tensor_to_f32(const st_tensor *t, float *dst, size_t count, char *err, size_t errlen);

/* Scalar conversions (also used by the writer and by mkmodel). Round to nearest even. */
float st_bf16_to_f32(uint16_t h);
uint16_t st_f32_to_bf16(float f);
float st_f16_to_f32(uint16_t h);
uint16_t st_f32_to_f16(float f);

/* ---- writing ---------------------------------------------------------------------- */

typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;          /* for st_write / st_write_mem; ignored by st_write_stream */
} st_write_desc;

/* Fills dst (exactly nbytes, the tensor's size in its dtype) with tensor i's bytes. */
typedef int (*st_fill_fn)(void *user, int i, void *dst, size_t nbytes, char *err, size_t errlen);

/* Write n tensors to path (via path.tmp + rename, so readers never see half a file).
 * metadata: optional NULL-terminated key/value list {"k1","v1","k2","v2",NULL}; "format":"pt"
 * is always written. Returns 0 or -1 with err. */
int st_write_stream(const char *path, const st_write_desc *d, int n, const char *const *metadata,
                    st_fill_fn fill, void *user, char *err, size_t errlen);
int st_write(const char *path, const st_write_desc *d, int n, const char *const *metadata,
             char *err, size_t errlen);
/* Same bytes into a malloc'd buffer (*out, *outlen; caller frees). */
int st_write_mem(const st_write_desc *d, int n, const char *const *metadata,
                 uint8_t **out, size_t *outlen, char *err, size_t errlen);

/* ---- sharded models ---------------------------------------------------------------- */

/* A set of files seen as one name space: dir/model.safetensors.index.json ("weight_map":
 * name → shard file) if present, else dir/model.safetensors. */
typedef struct st_set st_set;
int st_set_open_dir(const char *dir, st_set **out, char *err, size_t errlen);
void st_set_close(st_set *s);
const st_tensor *st_set_find(const st_set *s, const char *name);
int st_set_num_files(const st_set *s);

#endif
