#!/usr/bin/env python3
"""amsp data prepare beside Hugging Face tokenizers: tokens per second and peak memory,
the same documents, the same tokenizer.json, the same cores, in one run.

The corpus is JSON Lines made here to a chosen size from text on the machine: documents
of sentences drawn from the fortunes, the licence texts and validation/data/multilingual.txt,
with random numbers and identifiers mixed in so that the pre-tokenizer keeps meeting
words it has not seen (a corpus that repeats itself would flatter any word cache). The
tokenizer is a LLaMA-3-style byte-level BPE (its Split pattern, ignore_merges) trained
with tokenizers on a sample of the corpus.

Both sides tokenize every document and both use every core:
  - tokenizers: `Tokenizer.encode_batch` on batches of documents (its Rust threads,
    RAYON_NUM_THREADS = the core count); the timer covers encoding only, not reading
    or parsing the JSON, so the comparison favours tokenizers;
  - amsp: `amsp data prepare --threads N`, timed whole: reading, JSON parsing, the
    tokenizer, the held-out split and the compressed HDF5 writes.
Peak memory is each process's maximum resident set (for tokenizers: the Python process
holding one batch of documents and their encodings at a time).

  PY=$(validation/setup-python.sh) && $PY benchmarks/tokenize_bench.py build/amsp --size-mb 2048

The goal, printed not enforced: amsp at least as fast as tokenizers, and under 500 MB
of peak memory on a 2 GB corpus.
"""
import argparse
import glob
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MEMORY_GOAL_MB = 500


def sentences():
    pool = []
    paths = glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/games/fortunes/*")
    paths.append(os.path.join(HERE, "..", "validation", "data", "multilingual.txt"))
    for path in sorted(paths):
        if os.path.isfile(path) and not path.endswith((".dat", ".u8")):
            text = open(path, encoding="utf-8", errors="replace").read().replace("\0", "")
            pool.extend(line.strip() for line in text.splitlines() if len(line.strip()) > 3)
    return pool


def make_corpus(path, size_bytes, seed=1):
    rng = random.Random(seed)
    pool = sentences()
    written = docs = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            parts = []
            for _ in range(rng.randint(3, 60)):
                s = rng.choice(pool)
                r = rng.random()
                if r < 0.2:
                    s += f" {rng.randint(0, 10**rng.randint(1, 9))}"
                elif r < 0.3:
                    s += f" id_{rng.getrandbits(32):08x}"
                parts.append(s)
            line = json.dumps({"text": "\n".join(parts), "id": docs}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode())
            docs += 1
    return docs


def read_docs(path, limit=None):
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                return
            yield json.loads(line)["text"]


def train_tokenizer(corpus, out, vocab):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(read_docs(corpus, limit=20000), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    tok.save(out)


def hf_side(corpus, tokenizer, batch):
    """Runs in a child process so that its peak memory is its own."""
    tok = Tokenizer.from_file(tokenizer)
    tokens = 0
    seconds = 0.0
    docs = []
    for text in read_docs(corpus):
        docs.append(text)
        if len(docs) == batch:
            t = time.perf_counter()
            tokens += sum(len(e.ids) for e in tok.encode_batch(docs))
            seconds += time.perf_counter() - t
            docs = []
    if docs:
        t = time.perf_counter()
        tokens += sum(len(e.ids) for e in tok.encode_batch(docs))
        seconds += time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens": tokens, "seconds": seconds, "peak_mb": peak_mb}))


def amsp_side(amsp, corpus, tokenizer, out, threads):
    t = time.perf_counter()
    subprocess.run([amsp, "data", "prepare", "--input", corpus, "--tokenizer", tokenizer, "--output", out,
                    "--threads", str(threads)], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # no child ran before
    import h5py
    with h5py.File(out, "r") as f:
        tokens = f["/train/tokens"].shape[0] + f["/valid/tokens"].shape[0]
    return {"tokens": tokens, "seconds": seconds, "peak_mb": peak_mb}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-side":
        return hf_side(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("amsp")
    ap.add_argument("--size-mb", type=float, default=64, help="corpus size (default 64; the goal is for 2048)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--batch", type=int, default=1000, help="documents per encode_batch call")
    ap.add_argument("--work", help="directory for the corpus and outputs (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="amsp-tokenize-bench-")
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.jsonl")
    size = int(args.size_mb * 2**20)
    if not os.path.exists(corpus) or abs(os.path.getsize(corpus) - size) > 2**20:
        make_corpus(corpus, size)
    tokenizer = os.path.join(work, "tokenizer.json")
    train_tokenizer(corpus, tokenizer, args.vocab)

    # amsp first: the children's peak resident set is then amsp's alone.
    ours = amsp_side(args.amsp, corpus, tokenizer, os.path.join(work, "out.h5"), args.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, __file__, "--hf-side", corpus, tokenizer, str(args.batch)],
                         check=True, capture_output=True, text=True, env=env).stdout
    hf = json.loads(out.strip().splitlines()[-1])

    mb = os.path.getsize(corpus) / 2**20
    print(f"corpus {mb:.0f} MiB JSON Lines, tokenizer LLaMA-3-style BPE of {args.vocab} ids, {args.threads} threads")
    print(f"{'':28s} {'tokens':>12s} {'seconds':>8s} {'Mtokens/s':>10s} {'MiB/s':>7s} {'peak MiB':>9s}")
    for name, r in (("tokenizers encode_batch", hf), ("amsp data prepare", ours)):
        print(f"{name:28s} {r['tokens']:12d} {r['seconds']:8.2f} {r['tokens'] / r['seconds'] / 1e6:10.2f} "
              f"{mb / r['seconds']:7.1f} {r['peak_mb']:9.0f}")
    speed = (ours["tokens"] / ours["seconds"]) / (hf["tokens"] / hf["seconds"])
    print(f"amsp / tokenizers speed: {speed:.2f}x (goal >= 1); amsp peak {ours['peak_mb']:.0f} MiB "
          f"(goal < {MEMORY_GOAL_MB} MiB on a 2 GiB corpus)")
    if hf["tokens"] != ours["tokens"]:
        sys.exit(f"tokenize_bench: token counts differ: tokenizers {hf['tokens']}, amsp {ours['tokens']}")


if __name__ == "__main__":
    main()
