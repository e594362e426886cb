#!/usr/bin/python3
# The golden of the Keras article's offline augmentation (issue 33), as Pillow computes it, for
# tests/data/article_augment_test.cpp. The article loads each photo with Keras'
# load_img(path, target_size=(200, 200)) (Image.open, convert("RGB"), resize((200, 200),
# Image.NEAREST): Keras' default interpolation is "nearest"), then saves it and a second copy:
# loaded.resize((250, 250)) with Image.resize's default filter, cropped to (0, 0, 200, 200).
#
# Re-run (Debian's python3-pil 9.4 and python3-numpy only; no torch, no pip packages):
#     /usr/bin/python3 tools/make_golden_article.py      # writes tests/golden/data/article.safetensors
#     /usr/bin/python3 tools/make_golden_article.py --out DIR --photos ../shared/data/catsdogs
# Deterministic: re-running rewrites identical bytes.
#
# Entries
#  - "pattern": a 23x31 RGB test image (smooth waves, an edge, noise) with its full pixels, and
#    "bicubic.<w>x<h>" / "bilinear.<w>x<h>": its Image.resize((w, h), BICUBIC / BILINEAR), full
#    pixels: the resampling filters alone, exact, without the shared photos.
#  - per photo of PHOTOS (../shared/data/catsdogs, not in the repository: hash and samples only,
#    tools/golden_images.py): "loaded.<photo>" (Keras' load_img at SIZE) and "crop.<photo>" (the
#    article's second copy). The script checks that Image.resize's default filter is BICUBIC for
#    RGB in this Pillow (the default since Pillow 7.0; NEAREST before), so "crop" is both the
#    article's call and an explicit BICUBIC.
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_images import golden_args, image_entries, write_safetensors_arrays  # noqa: E402

SIZE = 200     # the article's target_size
BIG = round(SIZE * 250 / 200)
PHOTOS = ["cat/cat.1.jpg", "cat/cat.596.jpg", "cat/cat.835.jpg", "dog/dog.1.jpg", "dog/dog.11.jpg",
          "dog/dog.927.jpg"]   # 300x280, 95x72, 1023x768, 327x499, 135x101, 59x80
PATTERN_SIZES = [(39, 29), (50, 11), (12, 9), (7, 5), (31, 23)]   # up, mixed, down, the identity


def pattern() -> np.ndarray:
    h, w = 23, 31
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(33)
    rgb = np.stack([128 + 110 * np.sin(x / 3.0) * np.cos(y / 4.0), 255 * (x + 2 * y > 35), 255 * x / (w - 1)], -1)
    return np.clip(rgb + rng.normal(0, 20, rgb.shape), 0, 255).astype(np.uint8)


def keras_load(path: str) -> Image.Image:
    img = Image.open(path)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img if img.size == (SIZE, SIZE) else img.resize((SIZE, SIZE), Image.NEAREST)


def article_crop(loaded: Image.Image) -> Image.Image:
    default = loaded.resize((BIG, BIG))   # the article's call: Image.resize's default filter
    explicit = loaded.resize((BIG, BIG), Image.BICUBIC)
    if default.tobytes() != explicit.tobytes():
        sys.exit(f"Pillow {Image.__version__}: Image.resize's default filter is not BICUBIC for RGB")
    return default.crop((0, 0, SIZE, SIZE))


def main() -> None:
    args = golden_args(__doc__, "data")
    entries = image_entries("pattern", pattern(), full=True)
    src = Image.fromarray(pattern(), "RGB")
    for w, h in PATTERN_SIZES:
        for name, f in (("bicubic", Image.BICUBIC), ("bilinear", Image.BILINEAR)):
            entries.update(image_entries(f"{name}.{w}x{h}", np.asarray(src.resize((w, h), f)), full=True))
    for rel in PHOTOS:
        loaded = keras_load(os.path.join(args.photos, rel))
        entries.update(image_entries("loaded." + rel, np.asarray(loaded), full=False))
        entries.update(image_entries("crop." + rel, np.asarray(article_crop(loaded)), full=False))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "article.safetensors")
    write_safetensors_arrays(path, entries, {"photos": ",".join(PHOTOS), "size": str(SIZE), "big": str(BIG),
                                             "pattern_sizes": ",".join(f"{w}x{h}" for w, h in PATTERN_SIZES),
                                             "pil": Image.__version__, "generator": "tools/make_golden_article.py"})
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(entries)} tensors)")


if __name__ == "__main__":
    main()
