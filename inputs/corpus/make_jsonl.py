#!/usr/bin/env python3
"""A small corpus the way pretraining data ships, made from text on this machine:
compressed JSON Lines shards (one document per line under "text", as a Hugging Face
dataset's `to_json` writes them) and a byte-level BPE tokenizer.json trained on them
with Hugging Face `tokenizers`, LLaMA-3's pre-tokenizer pattern and special tokens.

    python3 -m venv build/py && build/py/bin/pip install tokenizers==0.19.1
    build/py/bin/python inputs/corpus/make_jsonl.py build/real

writes build/real/shards/{fortunes,licenses}-NNN.jsonl.gz and build/real/tokenizer.json
(4096 ids by default). The documents: every fortune of Debian's fortunes package, and every
paragraph of the licence texts in /usr/share/common-licenses.
"""
import argparse
import glob
import gzip
import json
import os
import subprocess

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
HERE = os.path.dirname(os.path.abspath(__file__))


def fortunes():
    files = subprocess.run([os.path.join(HERE, "files.sh")], check=True, capture_output=True,
                           text=True).stdout.split()
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        yield from (f.strip("\n") for f in text.split("\n%\n") if f.strip())


def licenses():
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            text = open(path, encoding="utf-8", errors="replace").read()
            yield from (p.strip("\n") for p in text.split("\n\n") if len(p.strip()) > 40)


def write_shards(out, name, docs, per_shard):
    paths, shard = [], []
    for d in list(docs) + [None]:
        if d is not None:
            shard.append(d)
        if len(shard) == per_shard or (d is None and shard):
            path = os.path.join(out, f"{name}-{len(paths):03d}.jsonl.gz")
            with gzip.open(path, "wt", encoding="utf-8") as f:
                for text in shard:
                    f.write(json.dumps({"text": text, "source": name}, ensure_ascii=False) + "\n")
            paths.append(path)
            shard = []
    return paths


def train_tokenizer(paths, vocab, out):
    def texts():
        for p in paths:
            with gzip.open(p, "rt", encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>",
        special_tokens=[(t, tok.token_to_id(t)) for t in specials])
    tok.save(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="directory to write (shards/ and tokenizer.json)")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    shards = os.path.join(args.out, "shards")
    os.makedirs(shards, exist_ok=True)
    paths = write_shards(shards, "fortunes", fortunes(), 4000) + write_shards(shards, "licenses", licenses(), 1000)
    train_tokenizer(paths, args.vocab, os.path.join(args.out, "tokenizer.json"))
    print(f"wrote {len(paths)} shards under {shards} and {os.path.join(args.out, 'tokenizer.json')} "
          f"({args.vocab} ids)")


if __name__ == "__main__":
    main()
