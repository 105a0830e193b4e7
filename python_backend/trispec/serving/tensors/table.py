"""The tensor table: every input and output of NVIDIA's ``tensorrt_llm_bls`` model, plus ours, each the
same as there, our extension, or refused (with why). config.pbtxt (``serving/repository.py``), the
request parser and docs/serving.md's tensor table all read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# how a tensor relates to tensorrt_llm_bls: the same meaning, ours only, or refused (``why`` says why)
Status = Literal["same", "extension", "refused"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    # Triton's config type name: TYPE_STRING, TYPE_INT32, ...
    triton_type: str
    # per-request dims, after Triton's batch dimension
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    status: Status = "same"
    # refused: the error message's reason; otherwise a note on a difference from the BLS model
    why: str = ""


_MULTIMODAL = "multimodal inputs are not served: the models here are text-only"
_LORA = "LoRA adapters are not served"
_PTUNING = "prompt tuning (prompt embedding tables) is not served"
_LOGITS = "logits are not returned: the speculative loop keeps them on the engine (use return_log_probs)"

INPUTS: tuple[TensorSpec, ...] = (
    # required by the BLS model; here input_ids may come instead (config.pbtxt marks it optional)
    TensorSpec("text_input", "TYPE_STRING"),
    # ours (TensorRT-LLM's tensorrt_llm model's input): the prompt as token ids of the served tokenizer
    TensorSpec(
        "input_ids",
        "TYPE_INT32",
        (-1,),
        status="extension",
        why="the prompt as token ids, instead of text_input (the output then holds no prompt text)",
    ),
    TensorSpec("decoder_text_input", "TYPE_STRING", status="refused", why="the models are decoder-only"),
    TensorSpec("image_input", "TYPE_FP16", (-1, 3, -1, -1), status="refused", why=_MULTIMODAL),
    TensorSpec("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), status="refused", why=_MULTIMODAL),
    TensorSpec("image_url_input", "TYPE_STRING", status="refused", why=_MULTIMODAL),
    TensorSpec("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), status="refused", why=_MULTIMODAL),
    # required by the BLS model; here it defaults to the YAML's defaults.max_tokens
    TensorSpec("max_tokens", "TYPE_INT32"),
    TensorSpec("bad_words", "TYPE_STRING", (-1,)),
    TensorSpec("stop_words", "TYPE_STRING", (-1,)),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL"),
    TensorSpec("end_id", "TYPE_INT32"),
    # ours (vLLM's name; its and SGLang's benchmarks send it): true = end_id -1, no end id at all
    TensorSpec(
        "ignore_eos",
        "TYPE_BOOL",
        status="extension",
        why="true: no end id ends the request (end_id -1), only max_tokens and stop words",
    ),
    # outputs are text, never padded token arrays: nothing to pad
    TensorSpec("pad_id", "TYPE_INT32"),
    TensorSpec("top_k", "TYPE_INT32"),
    TensorSpec("top_p", "TYPE_FP32"),
    TensorSpec("temperature", "TYPE_FP32"),
    # as in TensorRT-LLM it only weighs beams, and beam_width is 1
    TensorSpec("length_penalty", "TYPE_FP32"),
    TensorSpec("repetition_penalty", "TYPE_FP32"),
    TensorSpec("min_tokens", "TYPE_INT32"),
    TensorSpec("min_length", "TYPE_INT32", status="extension", why="the older BLS name of min_tokens"),
    TensorSpec("presence_penalty", "TYPE_FP32"),
    TensorSpec("frequency_penalty", "TYPE_FP32"),
    TensorSpec("seed", "TYPE_UINT64"),
    TensorSpec("random_seed", "TYPE_UINT64", status="extension", why="the older BLS name of seed"),
    TensorSpec("return_log_probs", "TYPE_BOOL"),
    # ours (OpenAI's top_logprobs): with return_log_probs, the N most likely tokens at each position
    TensorSpec(
        "top_log_probs",
        "TYPE_INT32",
        status="extension",
        why="with return_log_probs: the N (up to 20) most likely tokens and their log-probs at each position",
    ),
    # ours (OpenAI's echo with logprobs, vLLM's prompt_logprobs): the prompt computed whole, not
    # taken from the prefix cache
    TensorSpec(
        "return_prompt_log_probs",
        "TYPE_BOOL",
        status="extension",
        why="the log-prob of each prompt token after the first, on the first response",
    ),
    TensorSpec("return_context_logits", "TYPE_BOOL", status="refused", why=_LOGITS),
    TensorSpec("return_generation_logits", "TYPE_BOOL", status="refused", why=_LOGITS),
    TensorSpec("num_return_sequences", "TYPE_INT32"),
    TensorSpec("beam_width", "TYPE_INT32", why="only 1: speculative decoding here is not beam search"),
    TensorSpec("stream", "TYPE_BOOL"),
    TensorSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), status="refused", why=_PTUNING),
    TensorSpec("prompt_vocab_size", "TYPE_INT32", status="refused", why=_PTUNING),
    TensorSpec("prompt_table_extra_id", "TYPE_UINT64", status="refused", why=_PTUNING),
    # each word tokenised as a prompt is, every one of its tokens' logits + the word's weight
    TensorSpec("embedding_bias_words", "TYPE_STRING", (-1,)),
    TensorSpec("embedding_bias_weights", "TYPE_FP32", (-1,)),
    # ours (OpenAI's logit_bias): token ids and the biases added to their logits, pairwise
    TensorSpec(
        "logit_bias_ids",
        "TYPE_INT32",
        (-1,),
        status="extension",
        why="with logit_bias_values: the bias added to each of these token ids' logits",
    ),
    TensorSpec("logit_bias_values", "TYPE_FP32", (-1,), status="extension"),
    TensorSpec("num_draft_tokens", "TYPE_INT32"),
    # ours (OpenAI's Predicted Outputs): text the answer should repeat much of; drafts are copied from it
    TensorSpec(
        "prediction",
        "TYPE_STRING",
        status="extension",
        why="a predicted output: drafts copied from it instead of the drafter's, each verified as any draft",
    ),
    # acceptance follows speculation.sampling_rule here (coupled: equality with the target's token;
    # rejection: the draft's probabilities); outputs follow the target
    # either way, as in TensorRT-LLM where the flag only changes how many drafts are accepted
    TensorSpec("use_draft_logits", "TYPE_BOOL"),
    TensorSpec("lora_task_id", "TYPE_UINT64", status="refused", why=_LORA),
    TensorSpec("lora_weights", "TYPE_FP16", (-1, -1), status="refused", why=_LORA),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), status="refused", why=_LORA),
    TensorSpec("return_perf_metrics", "TYPE_BOOL"),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL"),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL"),
    # json, json_schema, regex or ebnf_grammar, and the schema, regex or grammar (none for json), as
    # NVIDIA's model maps them to TensorRT-LLM's GuidedDecodingParams; compiled here by llguidance
    TensorSpec("guided_decoding_guide_type", "TYPE_STRING"),
    TensorSpec("guided_decoding_guide", "TYPE_STRING"),
    # ours: a resumed stream (the client has these first tokens' text): generated again, not sent
    TensorSpec("skip_output_tokens", "TYPE_INT32", status="extension"),
    # ours: a resumed stream goes on only on a replica serving the model it began on
    TensorSpec("expected_model_fingerprint", "TYPE_STRING", status="extension"),
    # ours: the client's tokenizer (``Tokenizer.sha256``): one that renders chat prompts or counts
    # tokens for another model is refused rather than served a wrongly formatted prompt
    TensorSpec("expected_tokenizer_sha256", "TYPE_STRING", status="extension"),
    # ours (vLLM's name): KV-cache blocks are shared only among requests with the same salt;
    # TensorRT-LLM's executor takes it as Request(cache_salt_id)
    TensorSpec(
        "cache_salt",
        "TYPE_STRING",
        status="extension",
        why="prefix-cache isolation: blocks are shared only among requests with the same salt",
    ),
    # ours (vLLM's route name): an operator's request, alone and behind the admin key
    # (serving/admin.py); false asks for nothing
    TensorSpec(
        "reset_prefix_cache",
        "TYPE_BOOL",
        status="extension",
        why="true, alone: empty the prefix cache (every KV pool), behind the admin key",
    ),
)

OUTPUTS: tuple[TensorSpec, ...] = (
    # shape [1] per response, as the BLS model sends it (one text per response)
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    # with return_log_probs: the sum so far, and one value per token this response carries
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    # with top_log_probs N: [beam, tokens, N], most likely first, under output_log_probs' distribution;
    # where top-k / top-p leave fewer than N tokens the row is padded with id -1
    TensorSpec("output_top_token_ids", "TYPE_INT32", (-1, -1, -1), status="extension"),
    TensorSpec("output_top_log_probs", "TYPE_FP32", (-1, -1, -1), status="extension"),
    # with return_prompt_log_probs, on the first response: prompt tokens 1.. under the model's softmax
    # ([prompt tokens - 1]); with top_log_probs N too, their alternatives ([prompt tokens - 1, N])
    TensorSpec("prompt_log_probs", "TYPE_FP32", (-1,), status="extension"),
    TensorSpec("prompt_top_token_ids", "TYPE_INT32", (-1, -1), status="extension"),
    TensorSpec("prompt_top_log_probs", "TYPE_FP32", (-1, -1), status="extension"),
    # declared so that asking for them is not a Triton error; never sent (the inputs are refused)
    TensorSpec("context_logits", "TYPE_FP32", (-1, -1), status="refused", why=_LOGITS),
    TensorSpec("generation_logits", "TYPE_FP32", (-1, -1, -1), status="refused", why=_LOGITS),
    TensorSpec("batch_index", "TYPE_INT32"),
    TensorSpec("sequence_index", "TYPE_INT32"),
    # with return_perf_metrics, TensorRT-LLM's RequestPerfMetrics.kv_cache_metrics of the prompt in
    # the target's pool (batch_manager/kvCacheManager.cpp ``loadOrAllocateBlocks``, ``getFreeBlock``):
    # blocks taken from the pool for it (total), of them ones that never held KV (new), blocks found
    # in the prefix cache (reused) and not found (missed), reused / (reused + missed)
    TensorSpec("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    TensorSpec("kv_cache_reused_blocks", "TYPE_INT32"),
    TensorSpec("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    TensorSpec(
        "kv_cache_missed_blocks",
        "TYPE_INT32",
        status="extension",
        why="TensorRT-LLM's KvCacheMetrics.num_missed_blocks; NVIDIA's Triton models do not output it",
    ),
    TensorSpec(
        "kv_cache_hit_rate",
        "TYPE_FP32",
        status="extension",
        why="TensorRT-LLM's KvCacheMetrics.kv_cache_hit_rate; NVIDIA's Triton models do not output it",
    ),
    # ours (OpenAI's usage.prompt_tokens_details.cached_tokens): prompt tokens taken from the cache,
    # on the final response always, on every one with return_perf_metrics
    TensorSpec("cached_tokens", "TYPE_INT32", status="extension"),
    # with return_perf_metrics: wall-clock times (time.time_ns)
    TensorSpec("arrival_time_ns", "TYPE_INT64"),
    TensorSpec("first_scheduled_time_ns", "TYPE_INT64"),
    TensorSpec("first_token_time_ns", "TYPE_INT64"),
    TensorSpec("last_token_time_ns", "TYPE_INT64"),
    # acceptance over the request so far: on the final response always, on every one with
    # return_perf_metrics
    TensorSpec("acceptance_rate", "TYPE_FP32"),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32"),
    TensorSpec("total_draft_tokens", "TYPE_INT32"),
    TensorSpec("num_input_tokens", "TYPE_INT32"),
    # tokens this response carries (all of them in a one-shot response)
    TensorSpec("num_output_tokens", "TYPE_INT32"),
    # ours: tokens generated so far (cumulative), on every response
    TensorSpec("output_token_count", "TYPE_INT32", status="extension"),
    # ours, on the final response only: why it ended, and acceptance over the WHOLE request
    TensorSpec("finish_reason", "TYPE_STRING", status="extension"),
    TensorSpec("draft_tokens", "TYPE_INT32", status="extension"),
    TensorSpec("accepted_tokens", "TYPE_INT32", status="extension"),
    TensorSpec("verify_rounds", "TYPE_INT32", status="extension"),
    TensorSpec("mean_accepted_length", "TYPE_FP32", status="extension"),
    # the mean number of draft tokens planned per round (adaptive speculation's choice, <= the cap)
    TensorSpec("mean_num_draft_tokens", "TYPE_FP32", status="extension"),
    # ours, on a sampled sequence's first response: the seed it draws with (chosen here if it had none)
    TensorSpec("sampling_seed", "TYPE_UINT64", status="extension"),
    # ours, with skip_output_tokens: on the first response, the SHA-256 (hex) of the skipped tokens' text
    TensorSpec("skipped_text_sha256", "TYPE_STRING", status="extension"),
    # ours, on each sequence's first response: what produces the text (serving/fingerprint.py)
    TensorSpec("model_fingerprint", "TYPE_STRING", status="extension"),
)

REFUSED_INPUTS: tuple[TensorSpec, ...] = tuple(spec for spec in INPUTS if spec.status == "refused")
