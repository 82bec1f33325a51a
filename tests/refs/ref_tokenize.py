"""Tokenization: `flatkv model tokenize` equals llama.cpp's tokenize
(llama-cpp-python, vocab_only, add_bos=False, special=False) on Debian's Python
standard library sources listed in stdlib_texts.sha256 and on hand-picked short
strings (Unicode, digits, runs of whitespace); with special=True on a ChatML
prompt; and `tokenize --chat` equals llama.cpp's special tokenization of the
file's chat template rendered by Jinja2 for one user message."""
import json
import os
import sys
import tempfile

import jinja2

import refcommon

# Short strings nobody tokenized before: scripts, combining marks, digits in
# every form, whitespace runs of every kind, emoji with joiners.
SHORT = [
    "",
    " ",
    "   leading and trailing   ",
    "tabs\t\tand\nnewlines\n\n\n  \n",
    "12345678901234567890 3.14159 1e-10 0x7fff_ffff 1,000,000",
    "٣٤٥ ໒໓ ௧௨௩ ①②③ ½ ² Ⅻ",  # Arabic-Indic, Lao, Tamil digits, circled, fractions, superscripts, roman
    "Grüße, Jürgen! Ça va? Ñandú. Ελληνικά. Русский текст. עברית. العربية.",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "e\u0301 a\u0308 n\u0303 (combining marks) \u00e9 \u00e4 \u00f1",
    "emoji 👩‍👩‍👧‍👦 🇩🇪 👍🏽 ✨ and a lone \U0001F600",
    "non\u00a0breaking\u2003em\u2009thin\u3000ideographic spaces",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\tpass\r\n",
    "I'm you're they've we'll he'd it's DON'T 'quoted'",
    "<|im_start|>user\nspecial text stays text without --special<|im_end|>",
    "\u200bzero\u200dwidth\ufeffbom",
    "a" * 300 + " " + "9" * 50,
]


def compare(what, ours, ref):
    if ours == ref:
        return None
    i = next((k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k]), min(len(ours), len(ref)))
    return "%s: %d tokens, llama.cpp %d; first difference at token %d: flatkv %s, llama.cpp %s" % (
        what, len(ours), len(ref), i, ours[i:i + 8], ref[i:i + 8])


def main():
    a = refcommon.args()
    vocab = refcommon.llama_vocab(a.model)
    texts = refcommon.stdlib_texts()
    failures = []
    total = 0
    with tempfile.TemporaryDirectory(prefix="flatkv-tokenize-") as tmp:
        def ours(data, *flags):
            path = os.path.join(tmp, "text")
            with open(path, "wb") as f:
                f.write(data)
            return json.loads(refcommon.flatkv(a.flatkv, "model", "tokenize", "--model", a.model,
                                               "--text-file", path, *flags))

        with refcommon.Timer("tokenize %d files" % len(texts)):
            for rel, data in texts:
                ref = vocab.tokenize(data, add_bos=False, special=False)
                total += len(ref)
                bad = compare(rel, ours(data), ref)
                if bad:
                    failures.append(bad)
                print("%-34s %8d bytes %7d tokens %s" % (rel, len(data), len(ref), "DIFFERS" if bad else "equal"))
        for s in SHORT:
            data = s.encode()
            ref = vocab.tokenize(data, add_bos=False, special=False)
            bad = compare("short string %r" % s[:40], ours(data), ref)
            if bad:
                failures.append(bad)
        print("short strings: %d, %s" % (len(SHORT), "see failures" if failures else "all equal"))

        # Special tokens parsed (llama.cpp special=True) and the chat prompt.
        meta = vocab.metadata
        template = meta.get("tokenizer.chat_template")
        if not template:
            sys.exit("the model has no tokenizer.chat_template")
        for user in ["What is the capital of France?", "Grüße 123 — <|im_end|> in a prompt stays text"]:
            rendered = jinja2.Template(template).render(messages=[{"role": "user", "content": user}],
                                                        add_generation_prompt=True)
            special = vocab.tokenize(rendered.encode(), add_bos=False, special=True)
            bad = compare("--special of the rendered chat %r" % user, ours(rendered.encode(), "--special"), special)
            if bad:
                failures.append(bad)
            # --chat: the rendered prompt as llama.cpp tokenizes it with
            # special=True, except that special-token text inside the user's
            # message stays text (llama.cpp's template parts special, the
            # user's text plain, for that prompt).
            if "<|" not in user:
                chat_ref = special
            else:
                head, tail = rendered.split(user)
                chat_ref = (vocab.tokenize(head.encode(), add_bos=False, special=True) +
                            vocab.tokenize(user.encode(), add_bos=False, special=False) +
                            vocab.tokenize(tail.encode(), add_bos=False, special=True))
            bad = compare("--chat %r" % user, ours(user.encode(), "--chat"), chat_ref)
            if bad:
                failures.append(bad)
            print("chat %r: %d tokens (Jinja2 rendering, llama.cpp special=True) %s" %
                  (user, len(chat_ref), "DIFFERS" if bad else "equal"))
    if failures:
        print("\n".join(failures))
        sys.exit("%d tokenizations differ from llama.cpp" % len(failures))
    print("PASS: %d files (%d tokens), %d short strings and the chat prompts equal llama.cpp's tokenize" %
          (len(texts), total, len(SHORT)))


if __name__ == "__main__":
    main()
