#!/usr/bin/env python3
"""PyTorch FSDP on the same GPUs and model shape, for the throughput table of check.sh.

Launched with torchrun (one process per GPU). Hugging Face LlamaForCausalLM built from
the same config.json amsp trains, wrapped per decoder layer in FSDP (full shard, the
ZeRO-3 analogue) with bf16 mixed precision (bf16 parameters and reductions, fp32
master weights), AdamW, random tokens; no data loading, no checkpointing. Prints
"tokens_per_s_per_gpu X", the median over the timed steps.
"""

import argparse
import functools
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True, help="sequences per GPU")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    model = LlamaForCausalLM(LlamaConfig.from_json_file(a.config))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                          buffer_dtype=torch.bfloat16)
    model = FSDP(model, auto_wrap_policy=policy, mixed_precision=bf16, device_id=local)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    vocab = model.config.vocab_size if hasattr(model, "config") else 32000
    tokens = torch.randint(0, min(vocab, 256), (a.batch_size, a.seq_len), device="cuda")
    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.time()
        out = model(input_ids=tokens, labels=tokens)  # the model shifts the labels itself
        out.loss.backward()
        model.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 3:
            times.append(time.time() - t0)
    if dist.get_rank() == 0:
        print(f"tokens_per_s_per_gpu {a.batch_size * a.seq_len / statistics.median(times):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
