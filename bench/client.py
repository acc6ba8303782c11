"""The Python client's cost in a training loop.

* ``run.log_tensors`` on [64, 2048] torch tensors (ids, masks, seven float fields) while the
  server accepts the connection and never answers (the sender thread is stuck): the time the
  training loop pays per call, p50 and max over 20 calls; and the sender thread's time to build
  one safetensors file from them (without and with a byte-level tokenizer).

The safetensors-vs-JSONL ingest ratio, until stored and computable, is in bench/ingest.py.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
import warnings

from creditlens.wire import FLOAT_FIELDS


def _holding_server() -> tuple[socket.socket, threading.Event]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    release = threading.Event()

    def serve() -> None:
        conns = []
        while not release.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                break
        for c in conns:
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock, release


def _tensors(B: int, T: int):
    import torch

    g = torch.Generator().manual_seed(0)
    attn = torch.ones(B, T, dtype=torch.long)
    attn[:, -min(100, T // 8) :] = 0
    policy = torch.zeros(B, T, dtype=torch.long)
    policy[:, T // 4 :] = 1
    out = {
        "token_ids": torch.randint(0, 150_000, (B, T), generator=g),
        "attention_mask": attn,
        "policy_mask": policy,
        "reward": torch.rand(B, generator=g),
        "groups": torch.arange(B) // 8,
    }
    for name in FLOAT_FIELDS:
        out[name] = torch.rand(B, T, generator=g)
    return out


B, T, STEPS = 64, 2048, 20
QUICK = {"B": 8, "T": 256, "STEPS": 2}


def _client_overhead() -> dict:
    from creditlens import Client, _batch

    sock, release = _holding_server()
    port = sock.getsockname()[1]
    data = _tensors(B, T)
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = Client(f"http://127.0.0.1:{port}", create_timeout=0.2, max_queue=32, max_queue_bytes=1 << 32)
        run = client.run("bench")
        for step in range(STEPS):
            t0 = time.perf_counter()
            run.log_tensors(step, **data)
            times.append(time.perf_counter() - t0)
        assert run.dropped == 0
        release.set()
        sock.close()
        run.close(timeout=0)
    snap = _batch.snapshot(**data)
    t0 = time.perf_counter()
    body = _batch.build(snap)
    build_s = time.perf_counter() - t0
    tok = _byte_level_tokenizer()
    # Ids of real text (random ids would split characters everywhere, which text rarely does).
    text_ids = tok.encode("def f(x):\n\treturn x + 1  # the cat sat on the mat, café 😀\n" * 200).ids
    import torch

    ids = torch.tensor(text_ids[: B * T]).view(B, T) if len(text_ids) >= B * T else None
    if ids is None:
        reps = (B * T) // len(text_ids) + 1
        ids = torch.tensor((text_ids * reps)[: B * T]).view(B, T)
    snap = _batch.snapshot(**{**data, "token_ids": ids}, tokenizer=tok)
    _batch.build(snap)  # the first step scans the vocabulary and fills the per-id cache
    t0 = time.perf_counter()
    _batch.build(snap)
    build_tok_s = time.perf_counter() - t0
    return {
        f"client log_tensors [{B}, {T}], sender blocked: p50 s": round(statistics.median(times), 5),
        f"client log_tensors [{B}, {T}], sender blocked: max s": round(max(times), 5),
        f"client sender: build safetensors [{B}, {T}] s": round(build_s, 4),
        f"client sender: build with a byte-level tokenizer [{B}, {T}] s": round(build_tok_s, 4),
        f"client safetensors bytes [{B}, {T}]": len(body),
    }


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["def f(x):\n\treturn x + 1\n", "the cat sat on the mat\n"] * 200, trainer)
    return tok


def run() -> dict:
    return _client_overhead()


if __name__ == "__main__":
    for k, v in run().items():
        print(f"  {k:<55} {v}")
