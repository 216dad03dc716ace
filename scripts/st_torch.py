#!/usr/bin/python3
"""Minimal safetensors reader/writer for PyTorch, without the safetensors package.

Debian has no python3-safetensors, so the fixture generator writes files with
save() and checks read gwtf checkpoints with load(). The format: 8-byte
little-endian header length, a JSON header (name -> dtype, shape,
data_offsets; "__metadata__" -> str -> str), then the raw little-endian data.

    /usr/bin/python3 scripts/st_torch.py FILE                # list tensors and metadata
    /usr/bin/python3 scripts/st_torch.py --check-stage FILE  # load a gwtf checkpoint into
                                                             # the PyTorch model (strict)
"""
import json
import struct
import sys

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def save(path, tensors, metadata=None):
    """tensors: dict name -> tensor (written in insertion order)."""
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


def load(path):
    """Returns (dict name -> tensor, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = memoryview(data)[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        t = torch.frombuffer(bytearray(body[b:end]), dtype=dt) if end > b else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, meta


def check_stage(path):
    """Loads a gwtf stage checkpoint into scripts/gwtf_torch.py's modules with
    load_state_dict(strict=True): every name and shape must match PyTorch's
    model exactly, and every parameter must have both AdamW moments."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gwtf_torch as G
    tensors, meta = load(path)
    if meta.get("format") != "gwtf-stage-1":
        raise ValueError(f"{path}: not a gwtf stage checkpoint (format {meta.get('format')!r})")
    cfg = G.Cfg(meta["arch"], int(meta["d_model"]), int(meta["n_heads"]), int(meta["stage_layers"]),
                int(meta["d_ff"]), int(meta["vocab_size"]), int(meta["max_seq_len"]),
                float(meta["eps"]), float(meta["rope_theta"]))
    first = int(meta["first_layer"])
    params = {k: v for k, v in tensors.items() if not k.startswith("adam.")}
    loaded = 0
    if cfg.n_layers:
        blocks = G.Blocks(cfg)
        sd = {}
        for k, v in params.items():
            if k.startswith("blocks."):
                _, i, rest = k.split(".", 2)
                sd[f"blocks.{int(i) - first}.{rest}"] = v
        blocks.load_state_dict(sd, strict=True)
        loaded += len(sd)
    if meta["has_head"] == "1":
        head = G.Head(cfg)
        sd = {k: v for k, v in params.items() if not k.startswith("blocks.")}
        head.load_state_dict(sd, strict=True)
        loaded += len(sd)
    if loaded != len(params):
        raise ValueError(f"{path}: {len(params) - loaded} tensors belong to no module")
    for k, v in params.items():
        for m in ("adam.m.", "adam.v."):
            if tensors[m + k].shape != v.shape:
                raise ValueError(f"{path}: {m + k} has shape {list(tensors[m + k].shape)}")
    print(f"{path}: {loaded} parameters ({sum(v.numel() for v in params.values())} floats) "
          f"load into the PyTorch {cfg.arch} model (blocks {first}..{first + cfg.n_layers - 1}"
          f"{', head' if meta['has_head'] == '1' else ''}), moments present, step {meta['step']}")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check-stage":
        return check_stage(sys.argv[2])
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tensors, meta = load(sys.argv[1])
    for k, v in meta.items():
        print(f"meta {k} = {v}")
    for name, t in tensors.items():
        s = float(t.double().abs().sum()) if t.numel() else 0.0
        print(f"{name} {NAMES[t.dtype]} {list(t.shape)} sum|x|={s:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
