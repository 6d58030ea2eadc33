#!/usr/bin/env python3
"""Logits of a kiln checkpoint computed without kiln: an independent reader.

Parses the safetensors file and the MNIST IDX test images with Python's standard library
alone, runs lenet5 or mnist_cnn (kiln::nn::models, PyTorch's layouts: conv weights
[O, C, KH, KW], linear weights [out, in], flatten in C, H, W order) in float64 on the first
COUNT test images (pixels byte/255, no other normalisation) and prints one line of 10 logits
("%.9g") per image, as tests/programs/checkpoint_logits.cpp does with kiln.

  checkpoint_logits.py CHECKPOINT DATA_DIR MODEL COUNT [--torch]

--torch also computes them with PyTorch from the parsed tensors and prints them after a line
"torch"; without an importable torch it says so and exits 77.
"""
import argparse
import gzip
import json
import os
import struct
import sys


def read_safetensors(path):
    """{name: (shape, flat list of floats)} for every F32 tensor in the file."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8 : 8 + header_len])
    data = memoryview(blob)[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] != "F32":
            continue
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        count = 1
        for d in shape:
            count *= d
        if end - begin != 4 * count:
            sys.exit(f"{path}: tensor {name}: {end - begin} bytes for shape {shape}")
        tensors[name] = (shape, list(struct.unpack_from(f"<{count}f", data, begin)))
    return tensors


def read_images(data_dir, count):
    """The first `count` test images, each a list of rows of pixels in [0, 1]."""
    path = os.path.join(data_dir, "t10k-images-idx3-ubyte")
    if not os.path.exists(path):
        path += ".gz"
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 0x803 or count > n:
            sys.exit(f"{path}: not an IDX image file with {count} images")
        pixels = f.read(count * rows * cols)
    return [
        [[b / 255.0 for b in pixels[(i * rows + y) * cols : (i * rows + y + 1) * cols]]
         for y in range(rows)]
        for i in range(count)
    ]


# Activations are lists of channels, each a list of rows of floats.


def conv2d(x, weight, bias, pad=0):
    (o, c, k, _), wv = weight
    assert c == len(x)
    if pad:
        width = len(x[0][0]) + 2 * pad
        blank = [[0.0] * width] * pad
        x = [blank + [[0.0] * pad + row + [0.0] * pad for row in ch] + blank for ch in x]
    oh, ow = len(x[0]) - k + 1, len(x[0][0]) - k + 1
    out = []
    for oc in range(o):
        plane = [[bias[1][oc]] * ow for _ in range(oh)]
        for ic in range(c):
            for ky in range(k):
                for kx in range(k):
                    wt = wv[((oc * c + ic) * k + ky) * k + kx]
                    for y in range(oh):
                        src = x[ic][y + ky][kx : kx + ow]
                        plane[y] = [p + wt * v for p, v in zip(plane[y], src)]
        out.append(plane)
    return out


def pool2d(x, reduce):
    """2x2 pooling with stride 2 (reduce: max, or mean)."""
    return [
        [
            [reduce([ch[2 * y][2 * i], ch[2 * y][2 * i + 1], ch[2 * y + 1][2 * i],
                     ch[2 * y + 1][2 * i + 1]]) for i in range(len(ch[0]) // 2)]
            for y in range(len(ch) // 2)
        ]
        for ch in x
    ]


def relu(x):
    if isinstance(x[0], list):
        return [relu(part) for part in x]
    return [v if v > 0 else 0.0 for v in x]


def flatten(x):
    return [v for ch in x for row in ch for v in row]


def linear(x, weight, bias):
    (o, i), wv = weight
    assert i == len(x)
    return [bias[1][r] + sum(a * b for a, b in zip(wv[r * i : (r + 1) * i], x)) for r in range(o)]


def mean(v):
    return sum(v) / len(v)


def forward(model, t, image):
    """Logits of one image (a list of rows)."""
    x = [image]
    if model == "lenet5":
        x = pool2d(relu(conv2d(x, t["0.weight"], t["0.bias"], pad=2)), mean)
        x = pool2d(relu(conv2d(x, t["3.weight"], t["3.bias"])), mean)
        x = relu(linear(flatten(x), t["7.weight"], t["7.bias"]))
        x = relu(linear(x, t["9.weight"], t["9.bias"]))
        return linear(x, t["11.weight"], t["11.bias"])
    x = relu(conv2d(x, t["0.weight"], t["0.bias"]))
    x = pool2d(relu(conv2d(x, t["2.weight"], t["2.bias"])), max)
    x = relu(linear(flatten(x), t["6.weight"], t["6.bias"]))
    return linear(x, t["8.weight"], t["8.bias"])


def torch_logits(model, t, images):
    import torch
    import torch.nn.functional as F

    p = {k: torch.tensor(v, dtype=torch.float64).reshape(s) for k, (s, v) in t.items()}
    x = torch.tensor(images, dtype=torch.float64).unsqueeze(1)
    if model == "lenet5":
        x = F.avg_pool2d(F.relu(F.conv2d(x, p["0.weight"], p["0.bias"], padding=2)), 2)
        x = F.avg_pool2d(F.relu(F.conv2d(x, p["3.weight"], p["3.bias"])), 2).flatten(1)
        x = F.relu(F.linear(x, p["7.weight"], p["7.bias"]))
        x = F.relu(F.linear(x, p["9.weight"], p["9.bias"]))
        return F.linear(x, p["11.weight"], p["11.bias"]).tolist()
    x = F.relu(F.conv2d(x, p["0.weight"], p["0.bias"]))
    x = F.max_pool2d(F.relu(F.conv2d(x, p["2.weight"], p["2.bias"])), 2).flatten(1)
    x = F.relu(F.linear(x, p["6.weight"], p["6.bias"]))
    return F.linear(x, p["8.weight"], p["8.bias"]).tolist()


def print_logits(rows):
    for row in rows:
        print(" ".join("%.9g" % v for v in row))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data_dir")
    parser.add_argument("model", choices=["lenet5", "mnist_cnn"])
    parser.add_argument("count", type=int)
    parser.add_argument("--torch", action="store_true", help="also compute them with PyTorch")
    args = parser.parse_args()
    if args.torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("checkpoint_logits.py: --torch: PyTorch is not installed", file=sys.stderr)
            sys.exit(77)
    tensors = read_safetensors(args.checkpoint)
    images = read_images(args.data_dir, args.count)
    print_logits(forward(args.model, tensors, image) for image in images)
    if args.torch:
        print("torch")
        print_logits(torch_logits(args.model, tensors, images))


if __name__ == "__main__":
    main()
