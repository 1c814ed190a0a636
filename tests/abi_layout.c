/* Prints the size and field offsets of the public structs (gemma4c.h) as JSON, for the Python
 * bindings' test to compare with its ctypes mirrors (tests/test_api_examples.sh builds it
 * against the installed header). */
#include <gemma4c.h>
#include <stddef.h>
#include <stdio.h>

#define FIELD(T, f) printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(T, f)), first = 0
#define BEGIN(T) printf("%s\"%s\": {\"size\": %zu, \"fields\": {", n++ ? ", " : "", #T, sizeof(T)), first = 1
#define END() printf("}}")

int main(void) {
    int n = 0, first;
    printf("{");
    BEGIN(g4_error); FIELD(g4_error, msg); END();
    BEGIN(g4_load_params); FIELD(g4_load_params, n_threads); FIELD(g4_load_params, device);
    FIELD(g4_load_params, progress); FIELD(g4_load_params, progress_user);
    FIELD(g4_load_params, random_weights); FIELD(g4_load_params, random_type);
    FIELD(g4_load_params, bf16_activations); FIELD(g4_load_params, mmproj); END();
    BEGIN(g4_context_params); FIELD(g4_context_params, n_seq_max); FIELD(g4_context_params, n_ctx);
    FIELD(g4_context_params, n_batch); FIELD(g4_context_params, kv_type); FIELD(g4_context_params, kv_block_size);
    FIELD(g4_context_params, n_kv_blocks); FIELD(g4_context_params, kv_history);
    FIELD(g4_context_params, n_kv_sliding_blocks); END();
    BEGIN(g4_tokens); FIELD(g4_tokens, ids); FIELD(g4_tokens, n); FIELD(g4_tokens, cap); END();
    BEGIN(g4_chat_message); FIELD(g4_chat_message, content); FIELD(g4_chat_message, thinking);
    FIELD(g4_chat_message, tool_calls); FIELD(g4_chat_message, n_tool_calls); END();
    BEGIN(g4_sampler_params); FIELD(g4_sampler_params, temperature); FIELD(g4_sampler_params, top_k);
    FIELD(g4_sampler_params, top_p); FIELD(g4_sampler_params, min_p); FIELD(g4_sampler_params, repetition_penalty);
    FIELD(g4_sampler_params, presence_penalty); FIELD(g4_sampler_params, frequency_penalty);
    FIELD(g4_sampler_params, penalty_last_n); FIELD(g4_sampler_params, seed); FIELD(g4_sampler_params, bias_ids);
    FIELD(g4_sampler_params, bias_values); FIELD(g4_sampler_params, n_bias); FIELD(g4_sampler_params, suppress_ids);
    FIELD(g4_sampler_params, n_suppress); END();
    BEGIN(g4_generation_params); FIELD(g4_generation_params, max_new_tokens); FIELD(g4_generation_params, sampling);
    FIELD(g4_generation_params, ignore_eos); FIELD(g4_generation_params, stop_ids);
    FIELD(g4_generation_params, n_stop_ids); FIELD(g4_generation_params, stop_strings);
    FIELD(g4_generation_params, n_stop_strings); FIELD(g4_generation_params, parse_chat);
    FIELD(g4_generation_params, penalties_output_only); FIELD(g4_generation_params, logprobs);
    FIELD(g4_generation_params, top_logprobs); FIELD(g4_generation_params, json_object);
    FIELD(g4_generation_params, drafter); FIELD(g4_generation_params, n_draft);
    FIELD(g4_generation_params, media); FIELD(g4_generation_params, n_media);
    FIELD(g4_generation_params, grammar); END();
    BEGIN(g4_event); FIELD(g4_event, kind); FIELD(g4_event, token); FIELD(g4_event, text); FIELD(g4_event, len); END();
    printf("}\n");
    return 0;
}
