"""NVIDIA's tensorrt_llm_bls model's tensors (every input and output, with its data type and dims) and
helpers that build and parse a request's tensors, for the tensor-interface tests
(``test_serving_tensors.py``, ``test_serving_resume_inputs.py``).
"""

from __future__ import annotations

import numpy as np
from trispec.config import GenerationDefaults
from trispec.serving.tensors import (
    parse_inputs,
)

# NVIDIA's tensorrt_llm_bls model (TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
# tensorrt_llm_bls/config.pbtxt, 2025): every input and output, with its data type and dims
BLS_INPUTS = {
    "text_input": ("TYPE_STRING", (1,)),
    "decoder_text_input": ("TYPE_STRING", (1,)),
    "image_input": ("TYPE_FP16", (-1, 3, -1, -1)),
    "image_bytes_input": ("TYPE_UINT8", (-1, -1, -1, -1)),
    "image_url_input": ("TYPE_STRING", (1,)),
    "video_bytes_input": ("TYPE_UINT8", (-1, -1, -1, -1)),
    "max_tokens": ("TYPE_INT32", (1,)),
    "bad_words": ("TYPE_STRING", (-1,)),
    "stop_words": ("TYPE_STRING", (-1,)),
    "exclude_input_in_output": ("TYPE_BOOL", (1,)),
    "end_id": ("TYPE_INT32", (1,)),
    "pad_id": ("TYPE_INT32", (1,)),
    "top_k": ("TYPE_INT32", (1,)),
    "top_p": ("TYPE_FP32", (1,)),
    "temperature": ("TYPE_FP32", (1,)),
    "length_penalty": ("TYPE_FP32", (1,)),
    "repetition_penalty": ("TYPE_FP32", (1,)),
    "min_tokens": ("TYPE_INT32", (1,)),
    "presence_penalty": ("TYPE_FP32", (1,)),
    "frequency_penalty": ("TYPE_FP32", (1,)),
    "seed": ("TYPE_UINT64", (1,)),
    "return_log_probs": ("TYPE_BOOL", (1,)),
    "return_context_logits": ("TYPE_BOOL", (1,)),
    "return_generation_logits": ("TYPE_BOOL", (1,)),
    "num_return_sequences": ("TYPE_INT32", (1,)),
    "beam_width": ("TYPE_INT32", (1,)),
    "stream": ("TYPE_BOOL", (1,)),
    "prompt_embedding_table": ("TYPE_FP16", (-1, -1)),
    "prompt_vocab_size": ("TYPE_INT32", (1,)),
    "prompt_table_extra_id": ("TYPE_UINT64", (1,)),
    "embedding_bias_words": ("TYPE_STRING", (-1,)),
    "embedding_bias_weights": ("TYPE_FP32", (-1,)),
    "num_draft_tokens": ("TYPE_INT32", (1,)),
    "use_draft_logits": ("TYPE_BOOL", (1,)),
    "lora_task_id": ("TYPE_UINT64", (1,)),
    "lora_weights": ("TYPE_FP16", (-1, -1)),
    "lora_config": ("TYPE_INT32", (-1, 3)),
    "return_perf_metrics": ("TYPE_BOOL", (1,)),
    "return_num_input_tokens": ("TYPE_BOOL", (1,)),
    "return_num_output_tokens": ("TYPE_BOOL", (1,)),
    "guided_decoding_guide_type": ("TYPE_STRING", (1,)),
    "guided_decoding_guide": ("TYPE_STRING", (1,)),
}


# logits take ${logits_datatype} there: TYPE_FP32 is its usual value
BLS_OUTPUTS = {
    "text_output": ("TYPE_STRING", (-1,)),
    "cum_log_probs": ("TYPE_FP32", (-1,)),
    "output_log_probs": ("TYPE_FP32", (-1, -1)),
    "context_logits": ("TYPE_FP32", (-1, -1)),
    "generation_logits": ("TYPE_FP32", (-1, -1, -1)),
    "batch_index": ("TYPE_INT32", (1,)),
    "sequence_index": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_reused_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", (1,)),
    "arrival_time_ns": ("TYPE_INT64", (1,)),
    "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
    "first_token_time_ns": ("TYPE_INT64", (1,)),
    "last_token_time_ns": ("TYPE_INT64", (1,)),
    "acceptance_rate": ("TYPE_FP32", (1,)),
    "total_accepted_draft_tokens": ("TYPE_INT32", (1,)),
    "total_draft_tokens": ("TYPE_INT32", (1,)),
    "num_input_tokens": ("TYPE_INT32", (1,)),
    "num_output_tokens": ("TYPE_INT32", (1,)),
}


DEFAULTS = GenerationDefaults(max_tokens=32, temperature=0.0)


def tensors(**values: object) -> dict[str, np.ndarray]:
    """Client-style tensors: every value in a [1, 1] array (strings as bytes, lists as [1, n])."""
    out = {}
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        elif isinstance(value, list):
            out[name] = np.array([[v.encode() if isinstance(v, str) else v for v in value]], dtype=object)
        elif isinstance(value, str):
            out[name] = np.array([[value.encode()]], dtype=object)
        else:
            out[name] = np.array([[value]])
    return out


def parse(**values: object):
    given = tensors(**values)
    return parse_inputs(given.get, DEFAULTS)
