"""Build a tiny Qwen2-VL (config, tokenizer, image processor, chat template) offline, for a real
vLLM on CPU to serve with random weights (``--load-format dummy``): the opt-in multimodal test's
target (tests/vlm_target/vlm_target.sh).

The tokenizer is the tiny Llama's byte-level BPE (``../shared/tools/make_tiny_model.py``, vocab
32000) plus Qwen2-VL's special tokens; the image processor is Qwen2-VL's with the released
model's patches (14 pixels, merged 2x2) and min_pixels (3,136), so an image adds the tokens of
replayer's ``qwen2-vl`` rule; max_pixels is 1,003,520 (1,280 tokens), not the released 12,845,056:
vLLM sizes its start-up dummy run by the largest image, and on CPU that one would not fit in
memory. The rule agrees for every image up to 1,003,520 pixels. The language model has 2 layers, hidden
size 64, head_dim 32 (vLLM's CPU attention takes no smaller); the vision tower 1 block.
Run with the vLLM venv's Python: ``python make_tiny_qwen2_vl.py BASE_TOKENIZER_DIR OUT_DIR``.
"""

import json
import os
import sys

from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLImageProcessor, Qwen2VLProcessor

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
MAX_PIXELS = 1280 * 28 * 28
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main(base: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    image_processor = Qwen2VLImageProcessor(
        min_pixels=3136, max_pixels=MAX_PIXELS, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    try:
        from transformers import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor()
    except Exception:  # a transformers without torchvision has no video processor
        video = None
    kwargs = {"video_processor": video} if video is not None else {}
    proc = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok, chat_template=CHAT_TEMPLATE, **kwargs)
    proc.save_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    vocab = -(-len(tok) // 64) * 64
    cfg = Qwen2VLConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "torch_dtype": "float32",
        },
        vision_config={
            "depth": 1,
            "embed_dim": 64,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    cfg.architectures = ["Qwen2VLForConditionalGeneration"]  # no weights saved: vLLM reads the class here
    cfg.save_pretrained(out)
    with open(os.path.join(out, "READY"), "w") as f:
        json.dump({"vocab": vocab, "special": ids}, f)
    print("ok", out, ids, file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
