"""Hugging Face transformers at real widths, built offline from their configs (`XxxConfig(...)`
+ `XxxModel(config)`: the library's own seeded init, no download), eager attention (the
classic MatMul/Softmax export), TorchScript-exported with dynamic batch and sequence axes.

- bert_base, distilbert: seq 128 with a padded attention mask (rows of random length).
- gpt2_decode: one GPT-2-small decode step with a 127-token KV cache as inputs
  (past_key_values) and the logits and grown cache as outputs.
- whisper_base_encoder (80 x 3000 log-mel frames), wav2vec2_base (1 s of 16 kHz audio),
  t5_small_encoder (seq 128, padded mask).
"""

from __future__ import annotations

from typing import Any

from families.base import Case, Feeds, normal, padded_tokens, register
from families.tiny import token_feeds

HF = ("torch", "transformers")
SEQ = 128
GPT2_PAST = 127


def _hf(cls_name: str, cfg_name: str, **cfg: Any) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(attn_implementation="eager", **cfg)
    return getattr(transformers, cls_name)(config).eval()


def _wrap(model: Any, fields: tuple[str, ...], keys: tuple[str, ...]) -> Any:
    """A module that calls `model(**dict(zip(keys, args)))` and returns the named fields."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, *args: Any) -> Any:
            out = self.m(**dict(zip(keys, args)))
            return tuple(getattr(out, f) for f in fields)

    return Wrapped().eval()


def _token_export(model: Any, fields: tuple[str, ...]) -> bytes:
    import torch

    from families import torch_export as tx

    ids, mask = padded_tokens(2, 16, 1000, 0)
    dyn = {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "S"}}
    dyn.update({f: {0: "B"} if f == "pooler_output" else {0: "B", 1: "S"} for f in fields})
    return tx.export(_wrap(model, fields, ("input_ids", "attention_mask")),
                     (torch.from_numpy(ids), torch.from_numpy(mask)),
                     ["input_ids", "attention_mask"], list(fields), dyn)


def bert_base() -> bytes:
    return _token_export(_hf("BertModel", "BertConfig"), ("last_hidden_state", "pooler_output"))


def distilbert() -> bytes:
    return _token_export(_hf("DistilBertModel", "DistilBertConfig"), ("last_hidden_state",))


def t5_small_encoder() -> bytes:
    # T5Config's defaults are t5-small: d_model 512, 6 layers, 8 heads, d_ff 2048.
    return _token_export(_hf("T5EncoderModel", "T5Config"), ("last_hidden_state",))


def whisper_base_encoder() -> bytes:
    import torch
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from families import torch_export as tx

    torch.manual_seed(0)
    import transformers

    cfg = transformers.WhisperConfig(
        d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_layers=6, decoder_attention_heads=8, decoder_ffn_dim=2048, num_mel_bins=80,
        attn_implementation="eager")
    enc = WhisperEncoder(cfg).eval()
    return tx.export(_wrap(enc, ("last_hidden_state",), ("input_features",)),
                     (torch.randn(1, 80, 3000),), ["input_features"], ["last_hidden_state"],
                     {"input_features": {0: "B"}, "last_hidden_state": {0: "B"}})


def wav2vec2_base() -> bytes:
    import torch

    from families import torch_export as tx

    model = _hf("Wav2Vec2Model", "Wav2Vec2Config")  # defaults: wav2vec2-base
    return tx.export(_wrap(model, ("last_hidden_state",), ("input_values",)),
                     (torch.randn(1, 16000) * 0.3,), ["input_values"], ["last_hidden_state"],
                     {"input_values": {0: "B", 1: "T"}, "last_hidden_state": {0: "B", 1: "F"}})


def _gpt2_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_{i}_{kv}" for i in range(layers) for kv in ("key", "value")]
    return past, [p.replace("past", "present") for p in past]


def gpt2_decode() -> bytes:
    """GPT2LMHeadModel (GPT-2 small) for one new token given a KV cache."""
    import torch
    import transformers

    from families import torch_export as tx

    model = _hf("GPT2LMHeadModel", "GPT2Config")
    layers, heads = model.config.n_layer, model.config.n_head
    dh = model.config.n_embd // heads

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: Any, mask: Any, *past: Any) -> Any:
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=ids, attention_mask=mask, past_key_values=cache,
                         use_cache=True)
            grown = out.past_key_values.layers
            return (out.logits, *(t for lay in grown for t in (lay.keys, lay.values)))

    past_names, present_names = _gpt2_names(layers)
    p = 8
    args = (torch.tensor([[5]]), torch.ones(1, p + 1, dtype=torch.int64),
            *(torch.randn(1, heads, p, dh) for _ in past_names))
    dyn = {"input_ids": {0: "B"}, "attention_mask": {0: "B", 1: "P1"}, "logits": {0: "B"}}
    dyn.update({n: {0: "B", 2: "P"} for n in past_names})
    dyn.update({n: {0: "B", 2: "P1"} for n in present_names})
    return tx.export(Step().eval(), args, ["input_ids", "attention_mask", *past_names],
                     ["logits", *present_names], dyn)


def _gpt2_feeds(b: int, seed: int) -> Feeds:
    import numpy as np

    past, _ = _gpt2_names(12)
    feeds: Feeds = {
        "input_ids": np.random.default_rng(seed).integers(0, 50257, (b, 1), dtype=np.int64),
        "attention_mask": np.ones((b, GPT2_PAST + 1), np.int64),
    }
    feeds.update({n: normal((b, 12, GPT2_PAST, 64), seed, n) for n in past})
    return feeds


def register_all() -> None:
    """The bert, decoder and encoder families."""
    tok = token_feeds(SEQ, 30522)
    register(Case("bert_base", "bert", bert_base, tok, needs=HF, config={"seq": SEQ},
                  note="BertModel seq 128, padded mask"))
    register(Case("distilbert", "bert", distilbert, tok, needs=HF, config={"seq": SEQ},
                  note="DistilBertModel seq 128, padded mask"))
    register(Case("gpt2_decode", "decoder", gpt2_decode, _gpt2_feeds, needs=HF,
                  config={"past": GPT2_PAST}, note="GPT-2 small, 1 token, 127-token KV cache"))
    register(Case("whisper_base_encoder", "encoder", whisper_base_encoder,
                  lambda b, seed: {"input_features": normal((b, 80, 3000), seed, "mel")},
                  needs=HF, note="80 x 3000 mel frames"))
    register(Case("wav2vec2_base", "encoder", wav2vec2_base,
                  lambda b, seed: {"input_values": normal((b, 16000), seed, "wav", 0.3)},
                  needs=HF, note="1 s at 16 kHz"))
    register(Case("t5_small_encoder", "encoder", t5_small_encoder, token_feeds(SEQ, 32128),
                  needs=HF, config={"seq": SEQ}, note="T5EncoderModel seq 128, padded mask"))
