/* gemma4c - an inference engine for Google's Gemma 4 models: the public C API.
 *
 * Build against it with `pkg-config --cflags --libs gemma4c` (libgemma4c.so, or libgemma4c.a
 * with `pkg-config --static`). docs/api.md has a short C and a short Python example.
 *
 *   model       g4_model_load: a checkpoint folder (weights, tokenizer, chat template, defaults)
 *   context     g4_context: the KV cache of n sequences; g4_decode runs one batch step
 *   text        g4_tokenize, g4_detokenize, g4_detok_stream (streaming)
 *   chat        g4_chat: messages (JSON) rendered by the model's own template; g4_chat_parse
 *               splits model output into thinking, answer and tool calls
 *   sampling    g4_sampler from g4_sampler_params (the model's defaults: g4_model_sampler_params)
 *   generation  g4_generation: one request on one sequence (sampler, stop ids and strings, token
 *               limit) pulled event by event (token, text, thinking, tool call) or run with a
 *               callback; g4_generation_cancel stops it from any thread
 *   embeddings  g4_embed: the mean of the final hidden states of a token sequence
 *   images      g4_image_load/decode, g4_image_encode: soft tokens for the prompt's <|image|> placeholders
 *   audio       g4_audio_load/decode, g4_audio_encode: soft tokens for the prompt's <|audio|> placeholders
 *
 * Conventions:
 * - Handles are opaque. A function that can fail returns 0 (or a count) on success and -1 on
 *   failure with a one-line message in the caller's g4_error (err may be NULL). Nothing in the
 *   library calls exit() or abort() on bad input.
 * - A NULL handle, or NULL for a pointer a call needs, is such a failure (the message names the call
 *   and the argument); getters then return 0, -1 or NULL as their kind of "none", and void calls
 *   (the *_free ones among them) do nothing.
 * - Parameter structs are zero-initialized for the defaults; a NULL params pointer means the
 *   defaults too. Fields are only ever added at the end.
 * - Text is UTF-8. Memory the library hands over (char *, id arrays) is released with g4_free.
 * - A model, tokenizer or chat template may be used from several threads at once; a context
 *   (with the generations on it), a chat, a sampler and a detok stream belong to one thread at
 *   a time, except g4_generation_cancel, which may be called from any thread or a signal handler.
 *   Contexts of one model on several threads take turns for each batch step (a step uses all of the
 *   model's threads), as do its drafters and its image and audio encoding.
 */
#ifndef GEMMA4C_H
#define GEMMA4C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define G4_VERSION_MAJOR 0
#define G4_VERSION_MINOR 1
#define G4_VERSION_PATCH 0
#define G4_VERSION "0.1.0"

#if defined(__GNUC__)
#define G4_API __attribute__((visibility("default")))
#else
#define G4_API
#endif

/* The version of the library loaded at run time ("0.1.0"); compare with G4_VERSION. */
G4_API const char *g4_version(void);

typedef struct g4_error {
    char msg[512];
} g4_error;

/* Writes a one-line message (printf format; newlines become spaces) into err, if non-NULL, and
 * returns -1: `return g4_fail(err, "...", ...);` reports a failure the library's way. */
G4_API int g4_fail(g4_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Releases memory the library returned (strings, id arrays). NULL is allowed. */
G4_API void g4_free(void *p);

/* ------------------------------------------------------------------ model */

typedef struct g4_model g4_model;
typedef struct g4_tokenizer g4_tokenizer;
typedef struct g4_chat_template g4_chat_template;

typedef struct g4_load_params {
    int n_threads;      /* CPU threads; 0: all cores */
    const char *device; /* "cpu", "cuda"; NULL or "auto": cuda when built and present */
    /* Called while weights are copied to a backend with its own memory (the CPU maps them and reads nothing
     * up front, so it reports nothing); fraction in [0,1]. May be NULL. */
    void (*progress)(float fraction, const char *what, void *user);
    void *progress_user;
    /* 1: read no weights: every weight of the config's shapes gets random values where it lives (BF16 matrices
     * uniform in +-sqrt(3/in), vectors 1 +- 0.1; the per-layer embedding table a backend keeps on the host is
     * zeros). For benchmarks of real shapes; dir may be a config.json file. */
    int random_weights;
    /* With random_weights: the matrices' type, as `gemma4c quantize --type` names it ("q4_0", "q8_0", "q4_k",
     * "q6_k", "mlx4" (group 64, bf16 scales), "mlx8", ...; NULL or "bf16": BF16), packed blocks of random codes
     * with fixed scales, made where the weights live. Routers and a host-kept per-layer table stay BF16. */
    const char *random_type;
    /* 1: products with BF16 weight matrices round the activations to bf16 (nearest even) once per product and
     * sum bf16 x bf16 products in f32, as llama.cpp and the usual GPU engines do: faster (the CPU's vdpbf16ps
     * where it has AVX512_BF16; elsewhere the same rounded inputs through the f32 kernels), but logits move by
     * about bf16's precision (~3 significant digits of each activation). 0 (default): f32 activations, the
     * exact path that matches transformers' f32 logits. CPU: prefill and decode alike (a row's value still does
     * not depend on the batch). CUDA: the prefill GEMMs take one bf16 part per activation instead of a bf16
     * hi + lo pair (as G4_CUDA_GEMM=bf16; also for quantized weights there); its decode GEMVs stay f32. */
    int bf16_activations;
    /* With a GGUF model file: llama.cpp's multimodal projector file ("mmproj-*.gguf", projector types gemma4v and
     * gemma4a) that holds the vision and audio towers (docs/mmproj.md). NULL: the one mmproj*.gguf beside the
     * model file, when there is exactly one (a load warning names it); none: a text-only model. With a model
     * folder it is an error (a folder carries its towers). */
    const char *mmproj;
} g4_load_params;

/* Loads a model folder: config.json and the weights (*.safetensors [+ index], bf16/f16/f32 or MLX
 * affine-quantized), and beside them, when present, tokenizer.json (+ tokenizer_config.json), the chat
 * template (chat_template.jinja, tokenizer_config.json's chat_template or chat_template.json) and
 * generation_config.json. The small files are read first, so a broken folder fails before the weights load.
 * `dir` may also be a GGUF file (llama.cpp's Gemma 4 layout, F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
 * Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS): config, tokenizer and chat template come from its metadata. */
G4_API int g4_model_load(const char *dir, const g4_load_params *params, g4_model **out, g4_error *err);
G4_API void g4_model_free(g4_model *model);

G4_API int g4_model_vocab_size(const g4_model *model);
G4_API int g4_model_n_layers(const g4_model *model);
G4_API int g4_model_hidden_size(const g4_model *model);
/* The backend the model runs on ("cpu" or "cuda"). */
G4_API const char *g4_model_device(const g4_model *model);
/* The memory of the model's backend free now and in all, in bytes (on the CPU the system's available memory):
 * what a KV cache may still take. */
G4_API int g4_model_memory(const g4_model *model, size_t *free_bytes, size_t *total_bytes, g4_error *err);
/* Backends this build contains, e.g. "cpu" or "cpu, cuda". */
G4_API const char *g4_backends(void);
/* The longest sequence the model was trained for (max_position_embeddings). */
G4_API int g4_model_n_ctx_train(const g4_model *model);
/* Warnings gathered while loading (unexpected tensors, ...): lines ending in '\n', or NULL. */
G4_API const char *g4_model_warnings(const g4_model *model);
/* What the folder held beside the weights; NULL when it had none. Owned by the model. */
G4_API const g4_tokenizer *g4_model_tokenizer(const g4_model *model);
G4_API const g4_chat_template *g4_model_chat_template(const g4_model *model);
/* Why the folder's chat template cannot be used (a Jinja error, a named list without "default"), or NULL: the
 * model loads without one, as transformers loads a tokenizer whose template fails only when a chat is rendered. */
G4_API const char *g4_model_chat_template_error(const g4_model *model);

/* Writing a model in another weight format (`gemma4c quantize`, random-weight checkpoints). The source is a
 * model folder or GGUF file (any dtype g4_model_load reads) or random weights for a config.json; `type`:
 *   q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs: a GGUF file in llama.cpp's Gemma 4 layout;
 *   mlx2 mlx3 mlx4 mlx5 mlx6 mlx8: an mlx-community folder (affine, `group` elements per scale);
 *   bf16 f16 f32: a GGUF file when `out` ends in .gguf, else a safetensors folder.
 * A source without a tokenizer gives an output without one. */
typedef struct g4_quantize_params {
    const char *in;            /* model folder or .gguf file; NULL with random_config */
    const char *random_config; /* config.json of random weights (when in is NULL) */
    const char *out;
    const char *type;
    int group;                 /* MLX group size: 32, 64 (default) or 128 */
    uint64_t seed;             /* random weights */
    int verbose;               /* one line per tensor on stderr */
} g4_quantize_params;

G4_API int g4_quantize(const g4_quantize_params *p, g4_error *err);

/* ---------------------------------------------------------------- context */

typedef struct g4_context g4_context;

/* Element type of the KV cache. */
typedef enum g4_kv_type { G4_KV_F32 = 0, G4_KV_BF16 = 1, G4_KV_F16 = 2 } g4_kv_type;
/* The KV cache type the commands and the server use unless told otherwise: bf16 on a GPU (half the bytes a
 * decode step reads, and the tensor-core attention of many-token steps), f32 on the CPU (exact). */
G4_API g4_kv_type g4_model_kv_type_preferred(const g4_model *model);

/* The KV cache is paged: positions are kept in blocks of kv_block_size rows taken from one pool per layer
 * type. Full-attention layers hold ceil(length / kv_block_size) blocks per sequence; sliding-window layers
 * hold only the blocks their window still needs plus n_batch positions of history for roll-backs
 * (about (window + n_batch) / kv_block_size). */
typedef struct g4_context_params {
    int n_seq_max;     /* sequences that can be live at once (default 1) */
    int n_ctx;         /* maximum positions per sequence (default: model max, capped at 8192) */
    int n_batch;       /* maximum tokens in one g4_decode call (default 512) */
    g4_kv_type kv_type;/* default G4_KV_F32 */
    int kv_block_size; /* positions per block (default 32) */
    int n_kv_blocks;   /* blocks of the full-attention pool (default: every sequence can reach n_ctx);
                          fewer blocks let more sequences share memory, and a step that finds no free block
                          fails with a message that says so (nothing is changed) */
    int kv_history;    /* sliding-window positions a sequence keeps beyond what its next step reads, so that it
                          can be rolled back that far (g4_seq_truncate): 0 = n_batch (the default), -1 = none
                          (for many sequences that are never rolled back, e.g. under a scheduler) */
    int n_kv_sliding_blocks; /* blocks of the sliding-window pool (default: every sequence's window and history,
                          one batch, and one window per sequence more for the prefix cache); more blocks keep
                          more cached prefixes resumable (g4_seq_reuse_prefix); fewer than one sequence's window
                          and history span is an error */
} g4_context_params;

G4_API int g4_context_new(g4_model *model, const g4_context_params *params, g4_context **out, g4_error *err);
G4_API void g4_context_free(g4_context *ctx);

G4_API g4_model *g4_context_model(const g4_context *ctx);
/* Positions per sequence the context holds. */
G4_API int g4_context_n_ctx(const g4_context *ctx);

/* Forget everything sequence `seq` has processed (its next position is 0). A generation running on the
 * sequence (reset or truncated under it) fails at its next step. */
G4_API void g4_seq_reset(g4_context *ctx, int seq);
/* Rolls sequence `seq` back to its first n positions (to reuse a shared prefix).
 * Sliding-window layers keep only the window's rows plus n_batch more, so a roll-back by more than
 * n_batch positions may be impossible: then it fails, nothing changes, and the caller resets the
 * sequence instead. */
G4_API int g4_seq_truncate(g4_context *ctx, int seq, int n, g4_error *err);
/* Number of positions sequence `seq` has processed. */
G4_API int g4_seq_length(const g4_context *ctx, int seq);
/* The token ids sequence `seq` holds, in position order (*n = g4_seq_length); -1 where a soft token
 * (an image or audio row) was fed, so that different images never look like a shared prefix. Valid until
 * the next call that changes the sequence. */
G4_API const int32_t *g4_seq_tokens(const g4_context *ctx, int seq, int *n);
/* Prefix cache: every whole block of kv_block_size positions a sequence has processed stays findable by its
 * content (the ids up to its end) while its rows are in the cache, also after the sequence moved on or was
 * reset, until the memory is needed (least recently freed first). This makes the empty sequence `seq` start
 * with the longest prefix of ids[0..n-1] it finds, and returns that prefix's length: a multiple of
 * kv_block_size, 0 when none (then nothing changes). Feed the rest from there. With sliding-window layers a
 * prefix can be resumed only where the cache still holds the window of rows before its end. Blocks holding a
 * negative id (a soft token: an image or audio row) are never cached. */
G4_API int g4_seq_reuse_prefix(g4_context *ctx, int seq, const int32_t *ids, int n);
/* Free blocks of the full-attention pool (of the sliding pool for a model without full layers). */
G4_API int g4_kv_free_blocks(const g4_context *ctx);
/* Bytes the KV cache holds in backend memory. */
G4_API size_t g4_kv_bytes(const g4_context *ctx);
/* The bytes g4_context_new(model, params) would take for its KV cache (0 with a message when params cannot make
 * a context, SIZE_MAX when they overflow): with g4_model_memory, how many sequences fit. */
G4_API size_t g4_kv_bytes_needed(const g4_model *model, const g4_context_params *params, g4_error *err);
/* How many sequences of params (its n_seq_max aside) the backend's free memory holds the KV cache of, keeping
 * G4_STEP_RESERVE_BYTES or 5% of the memory, whichever is more, for the steps' buffers: 1 .. max_seq (vLLM gives
 * 90% of a card to weights, activations and KV). *kv_bytes (may be NULL): the KV cache of that many. -1 with a
 * message when the backend does not say its memory. */
#define G4_STEP_RESERVE_BYTES ((size_t)2 << 30)
G4_API int g4_context_fit_sequences(const g4_model *model, const g4_context_params *params, int max_seq,
                                    size_t *kv_bytes, g4_error *err);

/* One batch step.  Tokens of one sequence must be contiguous in the batch and
 * in position order; each sequence's tokens continue at g4_seq_length(seq).
 * Rows with want_logits[i] != 0 (all rows if want_logits is NULL) get their
 * float32 logits written to `logits` in batch order, vocab floats per row;
 * with logits == NULL no logits are computed (a capture still sees the final norm). */
typedef struct g4_batch {
    int n_tokens;
    const int32_t *token;
    const int32_t *seq;          /* NULL: every token belongs to sequence 0 */
    const uint8_t *want_logits;  /* NULL: logits for every row */
    /* Multimodal input (image, video or audio soft tokens): each row whose token is one of the model's
     * soft-token placeholders takes, in batch order, the next row of embd [n_embd, hidden] as its input
     * embedding (used as given, not scaled); the per-layer-embedding path sees such a row as the pad token.
     * With embd NULL, placeholders are embedded as the pad token; otherwise their count must equal n_embd.
     * A run of consecutive image/video placeholders of one sequence is one image or frame: on a model with
     * use_bidirectional_attention "vision" its tokens also see the later tokens of the run (sliding layers),
     * so a run must not be split across batch steps. */
    const float *embd;
    int n_embd;
} g4_batch;

/* Logits that hold a NaN (weights with NaN or infinities) are an error, in both calls. */
G4_API int g4_decode(g4_context *ctx, const g4_batch *batch, float *logits, g4_error *err);
/* The same step, giving for each wanted row only the id of its largest logit (lowest id on ties) in `ids`:
 * greedy decoding without copying logits back from the device. */
G4_API int g4_decode_greedy(g4_context *ctx, const g4_batch *batch, int32_t *ids, g4_error *err);

/* Optional per-layer capture for tests and debugging: when set, the next
 * g4_decode copies the hidden state after every layer ([n_layers][n_tokens][H])
 * and after the final norm ([rows wanted][H]) into these buffers. */
G4_API void g4_context_capture(g4_context *ctx, float *hidden_per_layer, float *final_norm);

/* The embedding of a token sequence: the mean over its positions of the final hidden state
 * (after the final norm, as transformers' last_hidden_state), hidden_size floats into out.
 * Sequence `seq` of ctx is the scratch: it is reset before and after. */
G4_API int g4_embed(g4_context *ctx, int seq, const int32_t *ids, int n_ids, float *out, g4_error *err);

/* Benchmarks: the bytes of weights and KV cache one decode step of one token at position pos must read (the
 * per-layer table a backend keeps on the host and all but one embedding row left out unless the head reads
 * them; MoE: the top-k experts' share), the numerator of a decode roofline; and the copy bandwidth of the
 * model's device, bytes read plus written per second by a 1 GiB copy within the backend's memory (best of
 * five; 0 when the buffers cannot be had). */
G4_API double g4_model_decode_bytes(const g4_model *model, int pos, g4_kv_type kv_type);
G4_API double g4_model_copy_bandwidth(g4_model *model);

/* ------------------------------------------------------- images and audio */

/* Images and audio reach the decoder as soft tokens: rows of hidden_size floats made by the model's towers
 * that take the place of placeholder tokens (docs/gemma4-towers.md 4). A chat template writes one
 * placeholder per input (<|image|> for a content part {"type": "image"}, <|audio|> for {"type": "audio"});
 * g4_prompt_expand turns each into its blocks, <|image> + N x <|image|> + <image|> for an image and
 * <|audio> + N x <|audio|> + <audio|> for each 30 s clip of audio, and lines up the rows in the order the
 * expanded placeholders take them (g4_batch.embd). g4_generation_params.media does all of it for a
 * generation. Encoding holds a lock of the model: one input at a time per model. */

/* An 8-bit RGB image as transformers' load_image sees it (PIL: EXIF orientation applied, convert("RGB")):
 * JPEG, PNG, WebP and GIF (its first frame); other formats, and anything that is not an image, are an
 * error. */
typedef struct g4_image {
    int width, height;
    uint8_t *rgb; /* [height][width][3]; release with g4_image_free */
} g4_image;

/* Limits against oversized files and decompression bombs; 0 fields (or a NULL pointer) take the defaults. */
typedef struct g4_image_limits {
    size_t max_file_bytes; /* default 256 MiB */
    int64_t max_pixels;    /* width * height, default 89478485 (PIL's MAX_IMAGE_PIXELS) */
} g4_image_limits;

/* Decodes an image held in memory. */
G4_API int g4_image_decode(const void *data, size_t size, const g4_image_limits *limits, g4_image *out,
                           g4_error *err);
/* Reads and decodes a file; errors name the path. */
G4_API int g4_image_load(const char *path, const g4_image_limits *limits, g4_image *out, g4_error *err);
G4_API void g4_image_free(g4_image *img);

typedef enum g4_media_kind { G4_MEDIA_IMAGE = 1, G4_MEDIA_AUDIO = 3 } g4_media_kind;

/* The soft tokens of one input, in blocks: an image is one block, audio one block per clip of 30 s. */
typedef struct g4_soft_tokens {
    g4_media_kind kind;
    int n_blocks;
    int *block_tokens; /* [n_blocks] soft tokens of each block */
    int n_tokens;      /* their sum */
    int hidden;        /* floats per row: the model's hidden_size */
    float *rows;       /* [n_tokens, hidden], the blocks one after the other */
} g4_soft_tokens;

/* The soft tokens of an image through the model's vision tower (image processor settings from the model
 * folder's processor_config.json or preprocessor_config.json). budget: at most this many soft tokens, 70,
 * 140, 280, 560 or 1120; 0 takes the processor config's. An error when the model has no vision tower. */
G4_API int g4_image_encode(g4_model *model, const g4_image *img, int budget, g4_soft_tokens *out, g4_error *err);
/* The most soft tokens an image gets at a budget (0: the processor config's); 0 without a vision tower. */
G4_API int g4_image_max_tokens(const g4_model *model, int budget);
G4_API void g4_soft_tokens_free(g4_soft_tokens *s);

/* Audio: any file libsndfile reads (WAV, FLAC, OGG/Vorbis, Opus, MP3, ...) decoded to mono float PCM at
 * `rate` Hz: channels averaged, other sample rates converted with libsoxr at HQ quality (as librosa.load),
 * ceil(n * rate / rate_in) samples. *pcm is released with g4_free. Longer than 10 minutes is an error. */
G4_API int g4_audio_load(const char *path, int rate, float **pcm, size_t *n, g4_error *err);
/* The same for a file held in memory; `name` labels errors. */
G4_API int g4_audio_decode(const void *data, size_t size, const char *name, int rate, float **pcm, size_t *n,
                           g4_error *err);
/* The sample rate the model's audio tower takes (its feature extractor's, 16000); 0 without an audio tower. */
G4_API int g4_audio_rate(const g4_model *model);
/* The soft tokens of PCM at g4_audio_rate (log-mel features from the model folder's preprocessor config,
 * the audio tower, embed_audio). Audio longer than 30 s is split into clips of 30 s, each its own block. An
 * error when the model has no audio tower or the audio is too short for one feature frame. */
G4_API int g4_audio_encode(g4_model *model, const float *pcm, size_t n, g4_soft_tokens *out, g4_error *err);

/* Soft-token placeholders among ids[0..n): the rows a batch of these ids takes from g4_batch.embd. */
G4_API int g4_count_soft_tokens(const g4_model *model, const int32_t *ids, int n);
/* Tokens of ids[0..n) for the next g4_decode of at most max tokens such that no image's soft tokens are
 * split between two steps (they attend to one another): n when n <= max, else max or fewer; -1 with a
 * message when an image alone is longer than max. */
G4_API int g4_step_length(const g4_model *model, const int32_t *ids, int n, int max, g4_error *err);

/* Expands the placeholders of a prompt as the chat template writes it, one per input: the k-th <|image|>
 * becomes the blocks of the k-th image among inputs, and so on for each kind (the counts must match).
 * *out_ids [*n_out] is the expanded prompt and *embd [*n_embd, hidden] the rows in the order its
 * placeholders take them (both g4_free). */
G4_API int g4_prompt_expand(const g4_model *model, const int32_t *ids, int n, const g4_soft_tokens *inputs,
                            int n_inputs, int32_t **out_ids, int *n_out, float **embd, int *n_embd, g4_error *err);
/* The same rows for ids that already hold the expanded placeholders (as transformers' processor writes
 * input_ids): each kind's placeholders take the rows of that kind's inputs in order (counts must match). */
G4_API int g4_soft_tokens_gather(const g4_model *model, const int32_t *ids, int n, const g4_soft_tokens *inputs,
                                 int n_inputs, float **embd, int *n_embd, g4_error *err);

/* -------------------------------------------------------------- tokenizer */

/* A Hugging Face tokenizer.json (BPE, as Gemma 4 uses). A parsed binary form is cached under
 * $XDG_CACHE_HOME/gemma4c (or ~/.cache/gemma4c), named by the tokenizer's content (the 16 caches used last are
 * kept); $G4_TOKENIZER_CACHE_DIR names another folder,
 * $G4_NO_TOKENIZER_CACHE=1 turns the cache off. tokenizer_config.json beside the file is read too. */
G4_API int g4_tokenizer_load(const char *tokenizer_json_path, g4_tokenizer **out, g4_error *err);
/* DIR/tokenizer.json; for a GGUF file, the tokenizer of its metadata (cached the same way) */
G4_API int g4_tokenizer_load_dir(const char *model_dir, g4_tokenizer **out, g4_error *err);
G4_API void g4_tokenizer_free(g4_tokenizer *tok);

G4_API int g4_tokenizer_vocab_size(const g4_tokenizer *tok); /* max id + 1 */
G4_API int32_t g4_tokenizer_bos_id(const g4_tokenizer *tok); /* -1 if none */
G4_API int32_t g4_tokenizer_eos_id(const g4_tokenizer *tok); /* -1 if none */
/* Id of an exact piece: an added token's content first, then the model vocabulary. -1 if none. */
G4_API int32_t g4_tokenizer_token_id(const g4_tokenizer *tok, const char *piece);
/* Raw vocabulary string of an id, NUL-terminated; NULL if out of range or unused. */
G4_API const char *g4_tokenizer_piece(const g4_tokenizer *tok, int32_t id);
G4_API int g4_tokenizer_is_special(const g4_tokenizer *tok, int32_t id);

typedef struct g4_tokens {
    int32_t *ids; /* release with g4_free */
    size_t n, cap;
} g4_tokens;

/* Encodes text and appends the ids to out (zero-initialize it first). Special tokens written in
 * the text are matched, as Hugging Face does. add_bos != 0 adds the special tokens HF's
 * encode(text) adds (BOS for Gemma). Invalid UTF-8 is an error. */
G4_API int g4_tokenize(const g4_tokenizer *tok, const char *text, size_t len, int add_bos, g4_tokens *out,
                       g4_error *err);

/* Hugging Face's decode; skip_special drops special tokens. *out is NUL-terminated (g4_free);
 * *len is its length. Out-of-range ids are an error. */
G4_API int g4_detokenize(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **out,
                         size_t *len, g4_error *err);

/* Streaming decode: push one id at a time, get the newly printable text (never a broken UTF-8
 * sequence); the outputs concatenated equal g4_detokenize of the whole sequence. */
typedef struct g4_detok_stream g4_detok_stream;
G4_API g4_detok_stream *g4_detok_stream_new(const g4_tokenizer *tok, int skip_special); /* NULL: no memory, or tok NULL */
/* *text stays valid until the next call on s. */
G4_API int g4_detok_stream_push(g4_detok_stream *s, int32_t id, const char **text, size_t *len, g4_error *err);
G4_API int g4_detok_stream_flush(g4_detok_stream *s, const char **text, size_t *len);
G4_API void g4_detok_stream_free(g4_detok_stream *s);

/* ------------------------------------------------------------------- chat */

/* A chat template: the checkpoint's own Jinja template, rendered as transformers'
 * apply_chat_template renders it (special tokens of tokenizer_config.json as variables); model_dir
 * may also be a GGUF file (its tokenizer.chat_template, as g4_model_load takes it). */
G4_API int g4_chat_template_load_dir(const char *model_dir, g4_chat_template **out, g4_error *err);
/* A template file with explicit bos / eos strings (NULL: the variable is left undefined). */
G4_API int g4_chat_template_load_file(const char *jinja_path, const char *bos_token, const char *eos_token,
                                      g4_chat_template **out, g4_error *err);
/* A template file with the special tokens of a tokenizer_config.json. */
G4_API int g4_chat_template_load_file_config(const char *jinja_path, const char *tokenizer_config,
                                             g4_chat_template **out, g4_error *err);
G4_API void g4_chat_template_free(g4_chat_template *t);

/* A conversation: messages and the options the template sees.
 * request_json (may be NULL) is an object, as `gemma4c template` takes per line:
 *   {"messages": [{"role": ..., "content": ...}, ...], "tools": [...] | null,
 *    "enable_thinking": bool (undefined when absent), "add_generation_prompt": bool (default false),
 *    "chat_template_kwargs": {...} (more template variables)}
 * t is borrowed (g4_model_chat_template or one loaded above); NULL is an error. */
typedef struct g4_chat g4_chat;
G4_API int g4_chat_new(const g4_chat_template *t, const char *request_json, g4_chat **out, g4_error *err);
G4_API void g4_chat_free(g4_chat *c);
/* Appends a message with text content. */
G4_API int g4_chat_add(g4_chat *c, const char *role, const char *content, g4_error *err);
/* Appends any message object (tool calls, tool responses, content parts). */
G4_API int g4_chat_add_json(g4_chat *c, const char *message_json, g4_error *err);
/* Removes the last message (no-op when there is none); g4_chat_clear removes them all. */
G4_API void g4_chat_pop(g4_chat *c);
G4_API void g4_chat_clear(g4_chat *c);
G4_API int g4_chat_n_messages(const g4_chat *c);
/* The prompt text the template renders for the conversation (NUL-terminated, g4_free). */
G4_API int g4_chat_render(const g4_chat *c, char **out, size_t *len, g4_error *err);

/* Model output split the way Gemma 4 writes it: thinking `<|channel>thought\n...<channel|>`,
 * tool calls `<|tool_call>call:NAME{key:value,...}<tool_call|>` and the answer; the text ends
 * at <turn|>, <eos> or <|tool_response>. A tool call that does not parse stays in the answer
 * as text. Thinking blocks and the answer are trimmed of surrounding whitespace. */
typedef struct g4_chat_message {
    char *content;    /* the answer */
    char *thinking;   /* "" when none */
    char *tool_calls; /* JSON array of {"name": ..., "arguments": {...}}; "[]" when none */
    int n_tool_calls;
} g4_chat_message;

/* Parses a whole model output (decoded with special tokens kept). */
G4_API int g4_chat_parse(const char *text, size_t len, g4_chat_message *out, g4_error *err);
G4_API void g4_chat_message_free(g4_chat_message *m);

/* ---------------------------------------------------------------- sampler */

/* Order of operations as in transformers' generate(): logit bias, repetition penalty,
 * presence/frequency penalties, suppressed ids; then greedy (temperature 0) or temperature,
 * top-k, top-p, min-p and a draw. Deterministic for a seed on every machine. */
typedef struct g4_sampler_params {
    float temperature;        /* 0 = greedy (argmax, ties -> lowest id); below 1e-5 counts as 0 */
    int top_k;                /* 0 = off */
    float top_p;              /* 1.0 = off; in (0, 1] */
    float min_p;              /* 0 = off; in [0, 1] */
    float repetition_penalty; /* 1.0 = off; > 0 (HF: logit > 0 ? logit/p : logit*p) */
    float presence_penalty;   /* 0 = off; logit -= presence if count > 0 */
    float frequency_penalty;  /* 0 = off; logit -= frequency * count */
    int penalty_last_n;       /* ids the penalties look at: -1 all, 0 none */
    uint64_t seed;
    const int32_t *bias_ids;  /* bias_values[i] is added to the logit of bias_ids[i]; -INFINITY bans */
    const float *bias_values;
    int n_bias;
    const int32_t *suppress_ids; /* ids that are never drawn */
    int n_suppress;
} g4_sampler_params;

/* Neutral settings: temperature 1, no truncation, no penalties, seed 0. */
G4_API void g4_sampler_params_default(g4_sampler_params *p);
/* The model's defaults from generation_config.json, as transformers reads it (do_sample false:
 * greedy; top_k 50 unless set; suppress_tokens); arrays point into the model. */
G4_API void g4_model_sampler_params(const g4_model *model, g4_sampler_params *p);
/* The ids that end a turn (generation_config.json's eos_token_id, else config.json's). */
G4_API int g4_model_eos_ids(const g4_model *model, const int32_t **ids);

typedef struct g4_sampler g4_sampler;
/* Checks p (one-line errors naming the bad field) and allocates all it needs. */
G4_API int g4_sampler_new(const g4_sampler_params *p, int vocab_size, g4_sampler **out, g4_error *err);
G4_API void g4_sampler_free(g4_sampler *s);
/* Draws the next id from one row of vocab_size logits (not modified); -1 when every id is
 * banned. Does not add the id to the history: call g4_sampler_accept. */
G4_API int32_t g4_sampler_sample(g4_sampler *s, const float *logits);
/* Adds ids to the history the penalties look at (the prompt, then every generated id). */
G4_API void g4_sampler_accept(g4_sampler *s, int32_t id);
G4_API void g4_sampler_accept_many(g4_sampler *s, const int32_t *ids, int n);
/* Clears the history (the random state goes on); g4_sampler_seed restarts the random sequence. */
G4_API void g4_sampler_reset(g4_sampler *s);
G4_API void g4_sampler_seed(g4_sampler *s, uint64_t seed);

/* --------------------------------------------------- speculative decoding */

/* A drafter: a gemma4_assistant checkpoint (Gemma 4's multi-token-prediction assistant) loaded beside its main
 * model, on the main model's backend. It drafts tokens from the main model's own K/V cache and hidden state;
 * the main model checks a round of drafts in one step, as transformers 5.17's assisted generation does.
 * A generation uses one through g4_generation_params.drafter; g4_spec is the loop itself, for callers that
 * drive their own steps. */
typedef struct g4_drafter g4_drafter;

/* Loads DIR and checks that it can draft for `main` (hidden sizes, vocabulary, head sizes, kv heads and RoPE
 * of the layer types it reads); a mismatched pair is a one-line error. `main` must outlive the drafter. */
G4_API int g4_drafter_load(const char *dir, g4_model *main, g4_drafter **out, g4_error *err);
G4_API void g4_drafter_free(g4_drafter *d);
/* Drafts per round by default: the drafter's generation_config.json num_assistant_tokens (20 when absent). */
G4_API int g4_drafter_n_draft(const g4_drafter *d);
/* The kv_history (g4_context_params) a scheduler's context needs for generations with this drafter: each drafting
 * reads the last sliding-window rows of the sequence's last step, which a cache keeping only what the next step
 * reads may have released (-1: none needed). */
G4_API int g4_drafter_kv_history(const g4_drafter *d);

/* Speculative decoding of one sequence of a context whose model is the drafter's main model. */
typedef struct g4_spec g4_spec;

typedef struct g4_spec_params {
    int n_draft;                /* drafts per round; 0: the drafter's default. Below the context's n_batch. */
    const int32_t *stop_ids;    /* ids that end generation (eos): drafting stops after drafting one */
    int n_stop_ids;
    int (*cancelled)(void *user); /* asked between prefill chunks (may be NULL): non-zero stops the prefill */
    void *cancelled_user;
    int raw_q;                  /* sampling: verify as transformers 5.17 does, with q = softmax of the drafter's
                                   raw logits although drafts are its argmax (favours drafts: the output is no
                                   longer distributed as the main model's); 0: q = the point mass the draft was
                                   drawn from, lossless */
} g4_spec_params;

G4_API int g4_spec_new(g4_context *ctx, int seq, g4_drafter *d, const g4_spec_params *params, g4_spec **out,
                       g4_error *err);
G4_API void g4_spec_free(g4_spec *s);

/* Runs `prompt` through the sequence (continuing from its length) and keeps what the first round needs;
 * the last prompt row's logits go to `logits` (vocab floats): the caller picks the first token from them.
 * Returns 0, 1 when cancelled between chunks, or -1. */
G4_API int g4_spec_prefill(g4_spec *s, const int32_t *prompt, int n_prompt, float *logits, g4_error *err);

/* One round after `last`, the sequence's newest token (picked by the caller, not yet run through the model):
 * up to min(n_draft, budget - 1) drafts, one main-model step over [last, drafts], and the accepted drafts plus
 * one token of the main model (the correction, or a bonus when all were accepted) into out (room for
 * n_draft + 1), their count into *n_out (<= budget). smp NULL: greedy (argmax). A greedy sampler (temperature 0)
 * picks the largest adjusted logit of each row; a sampling one verifies by speculative sampling (the output is
 * distributed as the main model's with that sampler, see g4_spec_params.raw_q). smp's history must hold the
 * sequence so far (the caller accepts what it reports; a round leaves the history as it found it). Afterwards
 * the sequence holds everything but the newest token, as in plain decoding; a sequence changed by other calls
 * since (g4_decode, g4_seq_truncate, ...) needs a new g4_spec_prefill. */
G4_API int g4_spec_round(g4_spec *s, int32_t last, int budget, g4_sampler *smp, int32_t *out, int *n_out,
                         g4_error *err);

/* Drafts k tokens after `last` from the sequence as it is, without verifying them (nothing changes but the
 * drafts a next round would have used): benchmarks, inspection. */
G4_API int g4_spec_draft(g4_spec *s, int32_t last, int k, int32_t *drafts, g4_error *err);

/* Rounds since the last prefill: *n rounds, drafted[i] and accepted[i] drafts of round i (valid until the next
 * call on s). */
G4_API void g4_spec_rounds(const g4_spec *s, const int **drafted, const int **accepted, int *n);

/* ------------------------------------------------------------- generation */

/* A generation is one request on one sequence of a context: its prompt, sampler, stop
 * conditions and token limit, and the decoding of its output. g4_generation_next runs the
 * model one step at a time and hands out events; g4_generation_run does it with a callback.
 * (A batching scheduler takes the same parameters and delivers the same events.) */
typedef struct g4_generation g4_generation;

/* Constrained decoding (g4_generation_params.grammar): the output follows a grammar. Tokens that would break it
 * are never drawn, the eos and stop ids come only where the output is whole, and the generation stops where
 * nothing more can follow. A grammar holds no model: one serves any number of generations at once. */
typedef struct g4_grammar g4_grammar;

/* The output is one JSON document that the JSON Schema `schema` (its JSON text) accepts, written from its first
 * byte (OpenAI's response_format json_schema). Objects list their properties in the schema's order (required ones
 * always, optional ones or not); a schema listing properties takes other keys only with additionalProperties
 * true or a schema. Read: type, properties, required, additionalProperties, items, prefixItems, minItems,
 * maxItems, minLength, maxLength, enum, const, anyOf, oneOf, allOf (several schemas merged where exact), $ref into
 * the document,
 * nullable, integer and number bounds (a bounded number without an exponent), multipleOf (without bounds, with
 * bounds that pick a sign, or with at most 256 multiples between two bounds), format date / time / date-time /
 * duration / uuid / ipv4 / ipv6 / hostname / email, pattern (anchored ^...$,
 * the subset g4_grammar_regex reads); annotations are skipped; a keyword of one type in a schema without "type"
 * makes it that type. Any other keyword is an error naming it (a constraint is never dropped). */
G4_API int g4_grammar_json_schema(const char *schema, g4_grammar **out, g4_error *err);
/* The output is tool calls in Gemma 4's notation, `<|tool_call>call:NAME{key:value,...}<tool_call|>`, of the
 * functions of `tools` (OpenAI's tools array as JSON text), each call's arguments following its function's
 * parameter schema (as g4_grammar_json_schema reads it; keys in sorted order, as the chat template writes them).
 * name: only that function (NULL: any of them); max_calls: at most this many calls (0: no limit; at least one). */
G4_API int g4_grammar_tool_calls(const char *tools, const char *name, int max_calls, g4_grammar **out,
                                 g4_error *err);
/* The output matches a regular expression (ECMA-262 subset: alternation, groups, classes of any code points,
 * \d \w \s, ., quantifiers, escapes; no lookaround or backreferences), as a whole (vLLM's guided_regex). */
G4_API int g4_grammar_regex(const char *regex, g4_grammar **out, g4_error *err);
/* The output follows a grammar in GBNF, llama.cpp's notation (rules `name ::= ...`, the rule root; src/engine/gbnf.c
 * lists what it reads; special tokens by their text, <|tool_call>). */
G4_API int g4_grammar_gbnf(const char *text, g4_grammar **out, g4_error *err);
/* The output is one of n texts (vLLM's guided_choice). */
G4_API int g4_grammar_choice(const char *const *choices, int n, g4_grammar **out, g4_error *err);
G4_API void g4_grammar_free(g4_grammar *g);

typedef struct g4_generation_params {
    int max_new_tokens;                 /* 0: generation_config.json's limit, else until the context is full */
    const g4_sampler_params *sampling;  /* NULL: the model's defaults (g4_model_sampler_params) */
    int ignore_eos;                     /* 1: the model's eos ids do not end generation */
    const int32_t *stop_ids;            /* more ids that end generation */
    int n_stop_ids;
    const char *const *stop_strings;    /* text that ends generation; it is not shown */
    int n_stop_strings;
    int parse_chat;                     /* 1: split the text into answer, thinking and tool calls
                                           (g4_chat_start sets it) */
    int penalties_output_only;          /* 1: presence and frequency penalties count only the generated tokens
                                           (OpenAI, vLLM), the repetition penalty sees the prompt too (vLLM and
                                           transformers); 0: the prompt counts for all three (llama.cpp) */
    int logprobs;                       /* 1: keep each generated token's log-probability (g4_generation_logprobs) */
    int top_logprobs;                   /* with logprobs: also the n most likely tokens of each step (0..20) */
    int json_object;                    /* 1: the output is one JSON object (RFC 8259), starting at its '{':
                                           tokens that would break it are never drawn, and the generation
                                           stops when it is closed (OpenAI's response_format json_object) */
    g4_drafter *drafter;                /* speculative decoding with this drafter of the model (NULL: none); the
                                           output is the same as without (greedy: the same ids) */
    int n_draft;                        /* drafts per round; 0: the drafter's default */
    const g4_soft_tokens *media;        /* the prompt's images and audio: it holds one placeholder per input, as
                                           the chat template writes them, expanded as g4_prompt_expand does */
    int n_media;
    const g4_grammar *grammar;          /* the output follows this grammar (NULL: free); not with json_object */
} g4_generation_params;

typedef enum g4_event_kind {
    G4_EVENT_TOKEN = 0,     /* a generated token (every one, the final eos included): event.token */
    G4_EVENT_TEXT = 1,      /* text to show: all of it, or with parse_chat the answer; stop strings held back */
    G4_EVENT_THINKING = 2,  /* parse_chat: the model's thinking */
    G4_EVENT_TOOL_CALL = 3, /* parse_chat: one whole tool call, JSON {"name": ..., "arguments": {...}} */
    G4_EVENT_FINISH = 4,    /* scheduled generations only: the last event (g4_generation_finish says why) */
} g4_event_kind;

typedef struct g4_event {
    g4_event_kind kind;
    int32_t token;    /* G4_EVENT_TOKEN: the id; otherwise -1 */
    const char *text; /* NUL-terminated UTF-8 ("" for tokens); valid until the next call on the generation */
    size_t len;
} g4_event;

typedef enum g4_finish {
    G4_FINISH_NONE = 0,      /* still running */
    G4_FINISH_STOP = 1,      /* an eos or stop id, or a stop string */
    G4_FINISH_LENGTH = 2,    /* max_new_tokens or the context is full */
    G4_FINISH_CANCELLED = 3, /* g4_generation_cancel */
    G4_FINISH_ERROR = 4,     /* scheduled generations: it failed (g4_generation_error says why) */
} g4_finish;

/* prompt is the whole token sequence for `seq`. What the sequence already holds of it (the
 * longest common prefix of g4_seq_tokens and prompt) stays in the cache and is not processed
 * again; the rest is processed by the first g4_generation_next. */
G4_API int g4_generation_start(g4_context *ctx, int seq, const int32_t *prompt, int n_prompt,
                               const g4_generation_params *params, g4_generation **out, g4_error *err);
/* The reply to a conversation: renders it with a generation prompt, tokenizes it with the
 * model's tokenizer and starts a generation with parse_chat on `seq` (reusing what it holds). */
G4_API int g4_chat_start(const g4_chat *c, g4_context *ctx, int seq, const g4_generation_params *params,
                         g4_generation **out, g4_error *err);
/* The next event: 1 with *ev filled, 0 when the generation has finished, -1 on error. Each
 * model step (the prompt, then one per token) runs inside this call, and yields a TOKEN event
 * followed by the text it made printable (with a drafter, a step is a round: one or more tokens). */
G4_API int g4_generation_next(g4_generation *g, g4_event *ev, g4_error *err);
/* Runs to the end, calling on_event for every event; a non-zero return cancels (the events
 * already made are still delivered). 0 or -1. */
typedef int (*g4_event_fn)(const g4_event *ev, void *user);
G4_API int g4_generation_run(g4_generation *g, g4_event_fn on_event, void *user, g4_error *err);
/* Runs one model step (none when the generation has finished) and hands its events, with any
 * not yet taken by g4_generation_next, to on_event (a non-zero return cancels, as in
 * g4_generation_run). 1 while the generation goes on, 0 when it has finished, -1 on error.
 * Several generations on the sequences of one context can take turns step by step. */
G4_API int g4_generation_step(g4_generation *g, g4_event_fn on_event, void *user, g4_error *err);
/* Ends the generation before its next model step (finish G4_FINISH_CANCELLED). Safe from any
 * thread and from a signal handler. */
G4_API void g4_generation_cancel(g4_generation *g);
G4_API g4_finish g4_generation_finish(const g4_generation *g);
/* The generated ids so far. */
G4_API const int32_t *g4_generation_tokens(const g4_generation *g, int *n);
/* A token and its log-probability under the model: the log-softmax of the step's logits as the
 * model computed them, before any bias, penalty, temperature or truncation (vLLM's default). */
typedef struct g4_token_logprob {
    int32_t token;
    float logprob;
} g4_token_logprob;
/* With params.logprobs: the last generated token (the latest TOKEN event) with its log-probability,
 * and the step's top_logprobs most likely tokens (most likely first; ties: lower id first; *top
 * valid until the next step). -1 before the first token or without logprobs. */
G4_API int g4_generation_logprobs(const g4_generation *g, g4_token_logprob *chosen, const g4_token_logprob **top,
                                  int *n_top);
/* With a drafter: the rounds so far, drafted[i] and accepted[i] drafts of round i (*n = 0 without one). */
G4_API void g4_generation_rounds(const g4_generation *g, const int **drafted, const int **accepted, int *n);
/* Prompt tokens that the sequence already held (not processed again); for a scheduled generation, those
 * found in the prefix cache when it was first admitted (0 while it waits). */
G4_API int g4_generation_n_cached(const g4_generation *g);
/* The output so far as a message: exactly the TEXT, THINKING and TOOL_CALL events (without
 * parse_chat, content is all the text). The caller frees it with g4_chat_message_free. */
G4_API int g4_generation_message(const g4_generation *g, g4_chat_message *out, g4_error *err);
/* Appends the generation's output to the conversation as the assistant's message. */
G4_API int g4_chat_add_reply(g4_chat *c, const g4_generation *g, g4_error *err);
/* Frees it at any point (the sequence keeps what was processed). */
G4_API void g4_generation_free(g4_generation *g);
/* Why a scheduled generation failed (G4_FINISH_ERROR), or NULL. */
G4_API const char *g4_generation_error(const g4_generation *g);

/* -------------------------------------------------------------- scheduler */

/* Continuous batching: a scheduler serves many generations at once on the sequences of one context.
 * Each g4_scheduler_step is one batch step under the context's n_batch token budget: one token for
 * every running generation that is decoding, chunks of the prompts still being read, and waiting
 * requests admitted in arrival order while a sequence is free and the KV pools have room for their
 * prompts (an admitted request first takes the longest prefix of its tokens that the prefix cache
 * holds: g4_seq_reuse_prefix). When blocks run out, the newest requests are preempted: their blocks
 * are freed and they are recomputed later (prompt and tokens so far, often from the prefix cache).
 * Each generation has its own parameters (sampler, seed, stop ids and strings, limit, log-probabilities,
 * json_object, images and audio, a drafter) and gives the
 * events g4_generation_next would give, to its callback, from inside g4_scheduler_step, ending with
 * G4_EVENT_FINISH. On a backend whose ops are batch invariant (the CPU) a generation's tokens do not
 * depend on what it was batched with, preempted or resumed from the cache.
 * The scheduler takes every sequence of ctx: while it exists, g4_generation_start, g4_chat_start, g4_embed,
 * g4_spec_new and a second g4_scheduler_new on ctx fail. Create ctx with n_seq_max requests at once, kv_history
 * -1 (nothing is rolled back; with a drafter g4_drafter_kv_history) and n_kv_blocks for the memory. A generation
 * with a drafter (speculative decoding) feeds its pending drafts after its newest token in a step, as many as the
 * step's budget leaves after every decoding request's token (drafts go first when the pools run short); the kept
 * drafts and the main model's next token come out of that step together, and the next round is drafted before
 * the next step. Its first round starts from the hidden state of its prompt's first row, as transformers 5.17's
 * assisted generation does. g4_scheduler_submit* and
 * g4_generation_cancel may be called from any thread, g4_scheduler_step from one at a time. */
typedef struct g4_scheduler g4_scheduler;

G4_API int g4_scheduler_new(g4_context *ctx, g4_scheduler **out, g4_error *err);
/* Generations still in it end as cancelled (their FINISH events are delivered). */
G4_API void g4_scheduler_free(g4_scheduler *s);
/* Queues a generation of prompt[0..n_prompt-1] (copied). *out is its handle: g4_generation_cancel,
 * _finish, _tokens, _message and _error work on it (not _next or _run). Free it with
 * g4_generation_free after its FINISH event, or earlier on the thread that steps (e.g. in its
 * callback): an unfinished one is cancelled and its callback gets no more events. Fails at once on
 * an empty prompt, ids outside the vocabulary, a prompt that leaves no room in the context or does
 * not fit the KV pool. */
G4_API int g4_scheduler_submit(g4_scheduler *s, const int32_t *prompt, int n_prompt, const g4_generation_params *params,
                               g4_event_fn on_event, void *user, g4_generation **out, g4_error *err);
/* The reply to a conversation (as g4_chat_start: parse_chat on) through the scheduler. */
G4_API int g4_scheduler_submit_chat(g4_scheduler *s, const g4_chat *c, const g4_generation_params *params,
                                    g4_event_fn on_event, void *user, g4_generation **out, g4_error *err);
/* An embedding request: the mean over ids[0..n_ids-1] of the final hidden state (as g4_embed). It
 * makes no tokens; once it ended (FINISH, G4_FINISH_STOP) g4_generation_embedding has the result. */
G4_API int g4_scheduler_submit_embed(g4_scheduler *s, const int32_t *ids, int n_ids, g4_event_fn on_event, void *user,
                                     g4_generation **out, g4_error *err);
/* hidden_size floats, or NULL (not an embedding request, or not finished). */
G4_API const float *g4_generation_embedding(const g4_generation *g);
/* Runs one batch step and delivers its events. Returns the number of requests still waiting or
 * running (0: idle), or -1 when the step failed (a backend error): the step's requests then end with
 * G4_FINISH_ERROR (g4_generation_error says why), the others go on with the next step. */
G4_API int g4_scheduler_step(g4_scheduler *s, g4_error *err);

typedef struct g4_scheduler_stats {
    long steps;          /* batch steps run */
    long decode_tokens;  /* tokens fed after the prompt and kept (one per generated token but the last) */
    long prefill_tokens; /* prompt tokens fed (recomputed ones after a preemption included) */
    long reused_tokens;  /* prompt tokens found in the prefix cache instead */
    long preemptions;
    long draft_tokens;    /* drafts fed to verification steps (speculative decoding) */
    long accepted_tokens; /* of which kept */
    int running, waiting;
    double step_seconds;  /* wall time of the steps that ran a batch, from g4_scheduler_step's call to its return */
    double model_seconds; /* of which in the model's forward pass and its on-device sampling (until the ids or
                           * logits are back): the rest is the scheduler's own work and the requests' events */
    long draft_steps;     /* drafter steps run: the requests drafting after one batch step share each of them */
    double draft_seconds; /* of the step_seconds, in the drafter (its steps, the drafts back on the host) */
} g4_scheduler_stats;
G4_API void g4_scheduler_get_stats(const g4_scheduler *s, g4_scheduler_stats *out);

#ifdef __cplusplus
}
#endif
#endif
