#!/usr/bin/env python3
"""amsp's tokenizer.json against Hugging Face `tokenizers`, id for id.

Builds a JSON Lines corpus from text on the machine (the licence texts, the
fortunes, validation/data/multilingual.txt in many scripts), trains tokenizers
with the `tokenizers` package in the shapes the field ships (GPT-2 byte-level
BPE, LLaMA-3's pre-tokenizer pattern, Qwen2's with NFC, LLaMA-2 and Mistral style
with a normalizer or Metaspace and byte fallback), has `amsp data prepare` tokenize the
corpus with each, and compares the dataset's tokens with tokenizers' own
encoding of the same documents. Any difference fails, naming the first document
and position where the two part.

  PY=$(validation/setup-python.sh) && $PY validation/tokenizer_compare.py --amsp build/amsp --workdir /tmp/tc
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import unicodedata

import h5py
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    """Documents: each licence text, each fortune, each line of the multilingual
    sample, and that sample joined with the line ends and spacing that split
    patterns treat specially."""
    docs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            docs.append(open(path, encoding="utf-8", errors="replace").read())
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(path) and "." not in os.path.basename(path):
            text = open(path, encoding="utf-8", errors="replace").read()
            docs.extend(f for f in text.split("\n%\n") if f.strip())
    lines = open(os.path.join(HERE, "data", "multilingual.txt"), encoding="utf-8").read().splitlines()
    docs.extend(lines)
    for sep in ["\n", "\r\n", "\n\n\n  ", " \t\n \n", "\u3000\u00a0 "]:
        docs.append(sep.join(lines) + sep)
    docs.extend(nfc_documents())
    docs = [d.replace("\0", "") for d in docs if d.strip()]
    if len(docs) < 1000:
        sys.exit(f"tokenizer_compare: only {len(docs)} documents found; the fortunes package is missing?")
    return docs


def nfc_documents():
    """Every character that NFC changes, and every combining mark after letters
    it may compose with and before another mark, as tokenizers' own NFC finds
    them: what tells one NFC from another."""
    norm = normalizers.NFC()
    changed, marks = [], []
    for cp in range(0xA0, 0x30000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        if norm.normalize_str(c) != c:
            changed.append(c)
        if unicodedata.combining(c):
            marks.append(c)
    docs = [" ".join(changed[i:i + 200]) for i in range(0, len(changed), 200)]
    for i in range(0, len(marks), 50):
        chunk = marks[i:i + 50]
        docs.append(" ".join(f"{base}{m}{n}" for base in "aeoAu\u0915\u1100" for m, n in zip(chunk, chunk[1:] + chunk[:1])))
    return docs


def byte_level(docs, pattern, add_prefix_space, bos, eos, nfc=False):
    tok = Tokenizer(models.BPE(ignore_merges=pattern is not None))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t in (bos, eos, "<pad>") if t]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.add_tokens(["<tool>"])  # an added token that is normalized and not special
    single = f"{bos} $A {eos}" if eos else f"{bos} $A"
    ids = [(t, tok.token_to_id(t)) for t in (bos, eos) if t]
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                              processors.TemplateProcessing(single=single, special_tokens=ids)])
    return tok


def sentencepiece_like(docs, metaspace):
    """LLaMA-2's conversion (Prepend and Replace normalizers, no pre-tokenizer)
    or Mistral's newer one (Metaspace, prepend_scheme "first"), with byte
    fallback: a small alphabet leaves rare characters to the <0xXX> tokens."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(docs, trainer)
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    if not metaspace:  # no pre-tokenizer: this tokenizers cannot unset one but through the JSON
        spec = json.loads(tok.to_str())
        spec["pre_tokenizer"] = None
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


TOKENIZERS = {
    "gpt2": lambda d: byte_level(d, None, True, "<s>", "</s>"),
    "llama3": lambda d: byte_level(d, LLAMA3, False, "<|begin_of_text|>", None),
    "qwen2": lambda d: byte_level(d, QWEN2, False, "<|endoftext|>", None, nfc=True),
    "llama2": lambda d: sentencepiece_like(d, metaspace=False),
    "mistral": lambda d: sentencepiece_like(d, metaspace=True),
}


def first_difference(docs, expected, got):
    """The document and the position in it where two token streams part."""
    pos = 0
    for i, ids in enumerate(expected):
        theirs = got[pos:pos + len(ids)].tolist()
        if theirs != ids:
            k = next((j for j in range(len(ids)) if j >= len(theirs) or theirs[j] != ids[j]), len(ids))
            return (f"document {i} ({docs[i][:60]!r}...), token {k}: tokenizers {ids[max(0, k - 3):k + 5]}, "
                    f"amsp {theirs[max(0, k - 3):k + 5]}")
        pos += len(ids)
    return f"amsp has {len(got) - pos} tokens more than tokenizers after the last document"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(TOKENIZERS))
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    docs = corpus()
    jsonl = os.path.join(args.workdir, "corpus.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    failed = 0
    names = args.only.split(",") if args.only else list(TOKENIZERS)
    for name in names:
        tok = TOKENIZERS[name](docs)
        path = os.path.join(args.workdir, f"{name}.json")
        tok.save(path)
        out = os.path.join(args.workdir, f"{name}.h5")
        subprocess.run([args.amsp, "data", "prepare", "--input", jsonl, "--tokenizer", path, "--output", out,
                        "--valid-fraction", "0"], check=True, stdout=subprocess.DEVNULL)
        with h5py.File(out, "r") as f:
            got = np.asarray(f["/train/tokens"][:], dtype=np.int64)
            assert f.attrs["tokenizer"] == "huggingface", f.attrs["tokenizer"]
        expected = [e.ids for e in tok.encode_batch(docs)]
        total = sum(len(e) for e in expected)
        same = total == len(got) and np.array_equal(np.concatenate([np.asarray(e) for e in expected]), got)
        fallback = sum(1 for e in expected for i in e if 3 <= i < 259) if name in ("llama2", "mistral") else 0
        print(f"{name:8s} documents {len(docs)}  tokens {total}  amsp {len(got)}  "
              f"differences {'0' if same else 'FOUND'}" + (f"  byte-fallback tokens {fallback}" if fallback else ""))
        if not same:
            print(f"tokenizer_compare: {name}: {first_difference(docs, expected, got)}")
            failed += 1
    if failed:
        sys.exit(f"tokenizer_compare: {failed} tokenizer(s) differ from Hugging Face tokenizers")
    print("tokenizer_compare: all ids identical to Hugging Face tokenizers")


if __name__ == "__main__":
    main()
