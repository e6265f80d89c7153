#!/usr/bin/env python3
"""Train the small built-in Llama checkpoint that ships in ``argosy/models/builtin/``.

Text source: Jane Austen's six novels (Project Gutenberg texts, public domain) as shipped by the Debian
package ``r-cran-janeaustenr`` (MIT-licensed packaging). The package stores the novels as R data in a
lazy-load database (``data/Rdata.rdb`` + ``.rdx``); this script reads it with a small pure-Python R
unserializer, so neither R nor the package's dependencies need to be installed:

    apt-get download r-cran-janeaustenr          # just fetches the .deb, installs nothing
    nice -n 10 .venv/bin/python scripts/train_builtin_model.py --source r-cran-janeaustenr_1.0.0-1_all.deb

The defaults reproduce the shipped checkpoint (see argosy/models/builtin/README.md for the numbers).
``--minutes M`` instead fits the run to a wall-clock budget: the step count is fixed from the speed of
the first steps and printed as the equivalent ``--steps N``.

``--source`` may also be an unpacked/installed package directory (``/usr/lib/R/site-library/janeaustenr``,
the default when it exists). Without any source the script runs ``apt-get download`` itself.

Everything is seeded and the training length is a fixed number of steps, so a rerun on the same
software versions reproduces the same weights (single-threaded CPU).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "argosy" / "models" / "builtin"
INSTALLED_PKG = Path("/usr/lib/R/site-library/janeaustenr")
DEB_NAME = "r-cran-janeaustenr"

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
UNK, BOS, EOS, IM_START, IM_END = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------------
# A minimal reader for R's serialization format (XDR), enough for character vectors and named lists.
# --------------------------------------------------------------------------------------------------


class RList(list):
    """A decoded R vector; ``attrs`` holds its attributes (e.g. ``names``)."""

    attrs: dict


class _RUnserializer:
    def __init__(self, data: bytes) -> None:
        self.b = data
        self.o = 0
        self.refs: list = []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.b, self.o)
        self.o += 4
        return v

    def _len(self) -> int:
        n = self._int()
        if n == -1:  # long vector
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def read(self):
        if self.b[:2] != b"X\n":
            raise ValueError("not an R XDR serialization stream")
        self.o = 2
        version = self._int()
        self._int()  # writer R version
        self._int()  # minimal reader R version
        if version == 3:
            n = self._int()  # native encoding name
            self.o += n
        return self._item()

    def _pairlist_to_dict(self, p) -> dict:
        out = {}
        while isinstance(p, tuple) and p and p[0] == "pair":
            _, tag, car, cdr = p
            out[tag[1] if isinstance(tag, tuple) else tag] = car
            p = cdr
        return out

    def _item(self):
        flags = self._int()
        t = flags & 0xFF
        has_attr = flags & (1 << 9)
        has_tag = flags & (1 << 10)
        if t == 254:  # NILVALUE_SXP
            return None
        if t in (241, 242, 247, 251, 252, 253):  # base/empty/global env, missing arg, ...
            return ("special", t)
        if t == 255:  # REFSXP
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            sym = ("sym", self._item())
            self.refs.append(sym)
            return sym
        if t in (249, 250):  # namespace / package environment: a string vector
            self._int()
            n = self._int()
            x = ("ns", [self._item() for _ in range(n)])
            self.refs.append(x)
            return x
        if t in (2, 3, 5, 6, 17, 239, 240):  # pairlist-like
            attr = self._item() if has_attr else None
            del attr
            tag = self._item() if has_tag else None
            car = self._item()
            cdr = self._item()
            return ("pair", tag, car, cdr)
        if t == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None
            s = self.b[self.o : self.o + n]
            self.o += n
            return s.decode("utf-8", errors="replace")
        if t in (10, 13):  # logical, integer
            n = self._len()
            v = RList(struct.unpack_from(f">{n}i", self.b, self.o))
            self.o += 4 * n
        elif t == 14:  # double
            n = self._len()
            v = RList(struct.unpack_from(f">{n}d", self.b, self.o))
            self.o += 8 * n
        elif t in (16, 19, 20):  # character vector, list, expression
            n = self._len()
            v = RList(self._item() for _ in range(n))
        else:
            raise ValueError(f"unsupported R SEXP type {t}")
        v.attrs = self._pairlist_to_dict(self._item()) if has_attr else {}
        return v


def read_r_lazyload_db(data_dir: Path) -> dict[str, object]:
    """Read every object of an R lazy-load database (``Rdata.rdx`` index + ``Rdata.rdb`` blobs)."""
    index = _RUnserializer(gzip.decompress((data_dir / "Rdata.rdx").read_bytes())).read()
    variables = index[index.attrs["names"].index("variables")]
    blob = (data_dir / "Rdata.rdb").read_bytes()
    out = {}
    for name, (offset, length) in zip(variables.attrs["names"], variables, strict=True):
        chunk = blob[int(offset) : int(offset) + int(length)]
        out[name] = _RUnserializer(zlib.decompress(chunk[4:])).read()  # 4-byte length + zlib stream
    return out


# --------------------------------------------------------------------------------------------------
# Text extraction and cleaning
# --------------------------------------------------------------------------------------------------

BOOK_ORDER = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]


def locate_package(source: str | None, workdir: Path) -> tuple[Path, str]:
    """Return (package dir with data/Rdata.rdb, description of where it came from)."""
    if source is None and (INSTALLED_PKG / "data" / "Rdata.rdb").exists():
        source = str(INSTALLED_PKG)
    if source is None:
        log(f"no --source given: running `apt-get download {DEB_NAME}` into {workdir}")
        subprocess.run(["apt-get", "download", DEB_NAME], cwd=workdir, check=True)
        debs = sorted(workdir.glob(f"{DEB_NAME}_*.deb"))
        if not debs:
            sys.exit("apt-get download produced no .deb")
        source = str(debs[-1])
    src = Path(source)
    if src.is_file() and src.suffix == ".deb":
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        dest = workdir / "deb"
        subprocess.run(["dpkg-deb", "-x", str(src), str(dest)], check=True)
        pkg = dest / "usr/lib/R/site-library/janeaustenr"
        return pkg, f"{src.name} (sha256 {digest})"
    if (src / "data" / "Rdata.rdb").exists():
        return src, str(src)
    sys.exit(f"cannot find janeaustenr data under {src}")


def book_paragraphs(lines: list) -> list[str]:
    """Join the hard-wrapped Gutenberg lines into paragraphs, dropping titles and chapter headings."""
    paras, cur = [], []
    for line in list(lines) + [""]:
        line = (line or "").strip()
        if line:
            cur.append(line)
            continue
        if cur:
            paras.append(" ".join(cur))
            cur = []
    out = []
    for p in paras:
        p = p.replace("_", "")  # _italics_
        p = re.sub(r"\s+", " ", p).strip()
        letters = [c for c in p if c.isalpha()]
        if not letters:
            continue
        if sum(c.isupper() for c in letters) > 0.6 * len(letters):  # TITLES, CHAPTER I, THE END
            continue
        if re.fullmatch(r"(chapter|volume|vol\.?)\s+[\divxlc]+\.?", p, flags=re.I):
            continue
        if len(p) < 25 and not re.search(r"[.!?\"]$", p):  # "by", "Jane Austen (1803)", "Finis"
            continue
        out.append(p)
    # Drop the front matter before the first real sentence-bearing paragraph.
    while out and len(out[0]) < 60:
        out.pop(0)
    return out


def load_books(pkg: Path) -> dict[str, list[str]]:
    objs = read_r_lazyload_db(pkg / "data")
    return {name: book_paragraphs(objs[name]) for name in BOOK_ORDER}


def split_heldout(books: dict[str, list[str]], frac: float, seed: int, chunk: int = 20):
    """Split each book into runs of ``chunk`` consecutive paragraphs; a seeded ``frac`` of runs is held out."""
    rng = random.Random(seed)
    train, heldout = [], []
    for name in BOOK_ORDER:
        paras = books[name]
        runs = [paras[i : i + chunk] for i in range(0, len(paras), chunk)]
        for run in runs:
            (heldout if rng.random() < frac else train).append("\n\n".join(run))
    return train, heldout


def is_pure_speech(p: str) -> bool:
    return p.startswith('"') and p.endswith('"') and p.count('"') == 2 and 8 <= len(p) <= 600


def chat_documents(train_docs: list[str], seed: int) -> list[str]:
    """Turn runs of consecutive speeches in the novels into ChatML conversations (user/assistant turns)."""
    rng = random.Random(seed + 1)
    convs = []
    for doc in train_docs:
        paras = doc.split("\n\n")
        i = 0
        while i < len(paras) - 1:
            if is_pure_speech(paras[i]) and is_pure_speech(paras[i + 1]):
                turns = [paras[i], paras[i + 1]]
                j = i + 2
                max_turns = rng.choice([2, 2, 2, 4, 6])
                while j < len(paras) and len(turns) < max_turns and is_pure_speech(paras[j]):
                    turns.append(paras[j])
                    j += 1
                if len(turns) % 2:
                    turns.pop()
                text = ""
                for k, t in enumerate(turns):
                    role = "user" if k % 2 == 0 else "assistant"
                    text += f"{IM_START}{role}\n{t[1:-1].strip()}{IM_END}\n"
                convs.append(text)
                i += len(turns)
            else:
                i += 1
    return convs


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=IM_END,  # chat turns end here; </s> ends plain documents (both are eos in generation_config)
        unk_token=UNK,
        additional_special_tokens=[EOS, IM_START],
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Keep the template inside tokenizer_config.json as well (older readers look only there).
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    # Portable across transformers 4.x/5.x and other readers: the generic fast-tokenizer class name and the
    # long-standing ``additional_special_tokens`` key.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def build_model(args, vocab_size: int, bos_id: int, eos_ids: list[int]):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.context,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=bos_id,
        eos_token_id=eos_ids,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def evaluate(model, ids, context: int, max_windows: int | None = None) -> tuple[float, int]:
    """Mean next-token loss (nats) over non-overlapping windows of the held-out token stream."""
    model.eval()
    total, count = 0.0, 0
    starts = list(range(0, len(ids) - 1, context))
    if max_windows is not None:
        starts = starts[:max_windows]
    with torch.no_grad():
        for s in starts:
            window = ids[s : s + context + 1]
            if len(window) < 2:
                continue
            x = window[:-1].unsqueeze(0)
            y = window[1:].unsqueeze(0)
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum")
            total += loss.item()
            count += y.numel()
    model.train()
    return total / max(count, 1), count


def fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", help="r-cran-janeaustenr .deb or package directory (default: installed/apt)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--context", type=int, default=512, help="max_position_embeddings")
    ap.add_argument("--seq-len", type=int, default=512, help="training window length")
    ap.add_argument("--batch", type=int, default=4, help="windows per step")
    ap.add_argument("--steps", type=int, default=2395)
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="wall-clock budget for training: the step count is fixed from the speed of the first "
        "--calibrate-steps steps (all inside warmup) and printed, so `--steps N` reproduces the run exactly",
    )
    ap.add_argument("--calibrate-steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--chat-frac", type=float, default=0.08, help="max share of training tokens in ChatML form")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--max-minutes", type=float, default=45.0, help="safety stop (breaks reproducibility if hit)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        pkg, origin = locate_package(args.source, Path(tmp))
        log(f"source: {origin}")
        books = load_books(pkg)
    for name in BOOK_ORDER:
        log(f"  {name:17s} {len(books[name]):6d} paragraphs {sum(map(len, books[name])):9,d} chars")
    train_docs, heldout_docs = split_heldout(books, args.heldout_frac, args.seed)
    all_text = "\n\n".join(train_docs + heldout_docs)
    log(
        f"text: {len(all_text):,} chars (sha256 {hashlib.sha256(all_text.encode()).hexdigest()[:16]}); "
        f"train docs {len(train_docs)}, held-out docs {len(heldout_docs)} "
        f"({sum(map(len, heldout_docs)):,} chars)"
    )
    chats = chat_documents(train_docs, args.seed)
    log(f"chat conversations made from dialogue: {len(chats)}")

    # ---- tokenizer
    t0 = time.time()
    tok = train_tokenizer(train_docs, args.vocab)
    save_tokenizer(tok, out, args.context)
    vocab_size = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    log(f"tokenizer: vocab {vocab_size}, special ids {ids}, trained in {time.time() - t0:.1f}s")
    probe = "Elizabeth smiled — “naïve” 日本語 🙂\n\tdone"
    assert tok.decode(tok.encode(probe).ids, skip_special_tokens=True) == probe, "tokenizer does not round-trip"

    # ---- token streams
    def encode_docs(docs: list[str]) -> list[list[int]]:
        return [e.ids + [ids[EOS]] for e in tok.encode_batch(docs)]  # <s> ... </s>

    train_tok = encode_docs(train_docs)
    n_book = sum(map(len, train_tok))
    chat_tok = [e.ids for e in tok.encode_batch(chats)]  # <s><|im_start|>user ... <|im_end|>\n
    rng = random.Random(args.seed + 2)
    rng.shuffle(chat_tok)
    budget = int(args.chat_frac * n_book / (1 - args.chat_frac))
    kept, n_chat = [], 0
    for c in chat_tok:
        if n_chat + len(c) > budget:
            break
        kept.append(c)
        n_chat += len(c)
    docs = train_tok + kept
    rng.shuffle(docs)
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    held = torch.tensor([t for d in encode_docs(heldout_docs) for t in d], dtype=torch.long)
    chars_per_tok = sum(map(len, train_docs)) / n_book
    log(
        f"train tokens: {len(stream):,} ({n_book:,} book + {n_chat:,} chat in {len(kept)} conversations), "
        f"held-out tokens: {len(held):,}, {chars_per_tok:.2f} chars/token"
    )

    # ---- model
    model = build_model(args, vocab_size, ids[BOS], [ids[EOS], ids[IM_END]])
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.model.embed_tokens.weight.numel()
    log(f"model: LlamaForCausalLM {n_params:,} parameters ({n_params - n_embed:,} non-embedding), tied embeddings")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch * args.seq_len
    if args.minutes is None:
        plan = f"{args.steps} steps = {args.steps * tokens_per_step / len(stream):.2f} epochs"
    else:
        plan = f"{args.minutes:g} minutes (step count fixed after {args.calibrate_steps} steps)"
    log(f"training: {plan} of {args.batch} x {args.seq_len} tokens, lr {args.lr} cosine, {args.threads} thread(s)")
    model.train()
    t_train = time.time()
    ema = None
    step = 0
    if args.minutes is not None:
        assert args.calibrate_steps < args.warmup, "calibration must end inside warmup (schedule-independent)"
        args.steps = 10**9
    for step in range(args.steps):
        starts = torch.randint(0, len(stream) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([stream[s : s + args.seq_len + 1] for s in starts.tolist()])
        x, y = batch[:, :-1], batch[:, 1:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        done = step + 1
        elapsed = time.time() - t_train
        if done % args.log_every == 0 or done == 1:
            tps = done * tokens_per_step / elapsed
            eta = elapsed / done * (args.steps - done)
            log(
                f"step {done:5d}/{args.steps}  loss {loss.item():.3f} (ema {ema:.3f})  lr {lr_at(step):.2e}  "
                f"{tps:,.0f} tok/s  elapsed {fmt_time(elapsed)}  ETA {fmt_time(eta)}"
            )
        if args.eval_every and done % args.eval_every == 0 and done < args.steps:
            hl, _ = evaluate(model, held, args.seq_len, max_windows=12)
            log(f"  eval @ {done}: held-out loss {hl:.3f} nats/token (ppl {math.exp(hl):.1f}, first 12 windows)")
        if args.minutes is not None and done == args.calibrate_steps:
            per_step = elapsed / done
            args.steps = max(done + 1, int(args.minutes * 60 / per_step))
            log(
                f"calibrated: {per_step:.2f} s/step -> {args.steps} steps in {args.minutes:g} min "
                f"(reproduce with --steps {args.steps})"
            )
        if done >= args.steps:
            break
        if elapsed > args.max_minutes * 60:
            log(f"!! wall-clock safety stop after {done} steps (--max-minutes {args.max_minutes})")
            break
    train_seconds = time.time() - t_train

    # ---- final evaluation
    held_loss, held_count = evaluate(model, held, args.context)
    held_chars = sum(map(len, heldout_docs)) + 2 * len(heldout_docs)
    bpc = held_loss * held_count / held_chars / math.log(2)
    log(
        f"held-out: {held_loss:.4f} nats/token, perplexity {math.exp(held_loss):.2f}, {bpc:.3f} bits/char "
        f"over {held_count:,} tokens (uniform would be ln({vocab_size}) = {math.log(vocab_size):.3f})"
    )

    # ---- save
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    os.chmod(out / "model.safetensors", 0o644)
    # transformers 5 writes rope settings only under "rope_parameters"; add the classic keys for other readers.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", "float32")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    from transformers import GenerationConfig

    gc = GenerationConfig(
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOS], ids[IM_END]],
        pad_token_id=ids[EOS],
        do_sample=True,
        temperature=0.8,
        top_p=0.95,
        max_new_tokens=128,
    )
    gc.save_pretrained(str(out))

    # A small held-out sample (fits one context window) for the tests.
    sample, n = [], 0
    for doc in heldout_docs:
        for p in doc.split("\n\n"):
            k = len(tok.encode(p).ids)
            if n + k + 2 > 480:
                break
            if len(p) > 120:
                sample.append(p)
                n += k + 2
        if n > 400:
            break
    sample_text = "\n\n".join(sample) + "\n"
    (out / "heldout_sample.txt").write_text(sample_text)
    sample_ids = torch.tensor(tok.encode(sample_text).ids)
    sample_loss, _ = evaluate(model, sample_ids, args.context)
    log(f"heldout_sample.txt: {len(sample_ids)} tokens, loss {sample_loss:.4f} nats/token")

    # ---- samples
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(out))
    model.eval()
    samples = {}
    prompts = ["It was a fine morning, and", "Mr. Darcy", "She had never"]
    for prompt in prompts:
        enc = hf_tok(prompt, return_tensors="pt")
        with torch.no_grad():
            g = model.generate(**enc, do_sample=False, max_new_tokens=60, repetition_penalty=1.0)
        samples[f"greedy: {prompt}"] = hf_tok.decode(g[0], skip_special_tokens=True)
        torch.manual_seed(args.seed)
        with torch.no_grad():
            g = model.generate(**enc, do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=60)
        samples[f"temperature 0.8, top_p 0.95, seed {args.seed}: {prompt}"] = hf_tok.decode(
            g[0], skip_special_tokens=True
        )
    chat = hf_tok.apply_chat_template(
        [{"role": "user", "content": "Are you going to the ball tonight?"}], add_generation_prompt=True, tokenize=False
    )
    enc = hf_tok(chat, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        g = model.generate(**enc, do_sample=False, max_new_tokens=80)
    samples["chat greedy: Are you going to the ball tonight?"] = hf_tok.decode(
        g[0][enc["input_ids"].shape[1] :], skip_special_tokens=False
    )
    for k, v in samples.items():
        log(f"--- {k}\n{v}")

    stats = {
        "source": origin,
        "parameters": n_params,
        "non_embedding_parameters": n_params - n_embed,
        "vocab_size": vocab_size,
        "train_tokens": len(stream),
        "book_tokens": n_book,
        "chat_tokens": n_chat,
        "heldout_tokens": held_count,
        "heldout_loss_nats_per_token": round(held_loss, 4),
        "heldout_perplexity": round(math.exp(held_loss), 2),
        "heldout_bits_per_char": round(bpc, 4),
        "heldout_sample_loss": round(sample_loss, 4),
        "steps": step + 1,
        "tokens_per_step": tokens_per_step,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "args": vars(args),
        "samples": samples,
        "versions": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "python": sys.version.split()[0],
        },
    }
    (Path(tempfile.gettempdir()) / "argosy_builtin_train_stats.json").write_text(json.dumps(stats, indent=2))
    log(json.dumps({k: v for k, v in stats.items() if k not in ("samples", "args")}, indent=2))
    size = (out / "model.safetensors").stat().st_size
    log(f"saved to {out}: model.safetensors {size / 2**20:.1f} MiB; total time {fmt_time(time.time() - t_start)}")
    if shutil.which("du"):
        subprocess.run(["du", "-sh", str(out)])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
