#!/usr/bin/python3
# The end-to-end golden (issue 19): what PyTorch's pipeline makes of real photo files, stage by
# stage, so tests/e2e/e2e_golden_test.cpp can say which stage of minidl's own pipeline (decode,
# resize/crop, normalise, forward, loss, backward, optimizer step) is the first to differ.
#
# Re-run (Debian's python3-torch 1.13, python3-torchvision 0.14, python3-pil 9.4; no pip packages):
#     /usr/bin/python3 tools/make_golden_e2e.py                 # writes tests/golden/e2e/
#     /usr/bin/python3 tools/make_golden_e2e.py --out DIR --photos ../shared/data/catsdogs
# Deterministic: re-running rewrites identical bytes.
#
# Inputs
#  - PHOTOS: eight of the real cats-vs-dogs JPEGs in ../shared/data/catsdogs, chosen for their
#    sizes (59x80 and 95x72, smaller than the ImageNet resize; odd sizes such as 99x81; 1023x768).
#    They stay out of the repository (shared/data/README.md), so the golden keeps no pixels of
#    them: each image stage stores its shape, a 64-bit FNV-1a hash of the u8 bytes (exact
#    equality) and SAMPLES pixel values at fixed positions (to say by how much it differs), and the
#    model stages store only numbers derived from the batch. The C++ test skips them without
#    ../shared.
#  - FORMATS: small files made here from a synthetic pattern and committed in
#    tests/golden/e2e/formats/ (a 4:2:0 JPEG of odd size, a progressive JPEG, a grayscale JPEG, an
#    Adobe CMYK JPEG, RGB / RGBA / grayscale / palette PNGs), with their full decoded pixels.
#
# Stages, per photo (and per format file for "decoded"):
#  - "decoded.<name>": PIL's Image.open(f).convert("RGB") as HWC u8.
#  - "<setting>.<name>": the u8 HWC image after each deterministic transform at SIZE:
#      center   torchvision Resize(SIZE) + CenterCrop(SIZE)                   (--resize center)
#      imagenet torchvision Resize(round(SIZE*256/224)) + CenterCrop(SIZE)    (--resize imagenet)
#      squash   torchvision Resize((SIZE, SIZE))                              (--resize squash)
#      keras    PIL resize((SIZE, SIZE), NEAREST), exactly Keras' load_img    (--resize keras)
#    (Keras itself is not a Debian package; keras.utils.load_img is these two PIL calls.)
#    The random augmentations (RandomResizedCrop, the Keras crop) draw from Philox, not from
#    torch's generator, so they are not comparable draw by draw and are left out.
#  - "input.resnet18" [8,3,SIZE,SIZE] f32 moments: per-image, per-channel mean of the ToTensor +
#    Normalize(ImageNet) tensor of the center setting, f64 ("input.resnet18.mean").
#  - ResNet-18 (torchvision, num_classes=2) with the deterministic weights of
#    make_golden_resnet.golden_value, train mode, the 8 photos of the center setting, mean cross
#    entropy against labels 0 0 0 0 1 1 1 1: "resnet18.logits", ".loss", ".grad.<p>" for R18_KEYS,
#    ".running_mean.bn1", and the parameters R18_KEYS after one SGD step (lr 0.1, no momentum,
#    no weight decay: ".sgd.<p>") and, from the same start, one Adam step (lr 1e-3: ".adam.<p>").
#  - The Keras study's small CNN (PyTorch transcription of nn/keras_cnn.h) at SIZE on the keras
#    setting with pixels / 255 (Keras' rescale), binary cross entropy on the logit: "smallcnn.*"
#    likewise, for SMALLCNN_KEYS.
#  - "resnet18.bf16.*": the same ResNet-18 step under torch.autocast("cpu", dtype=torch.bfloat16)
#    (f32 weights, no gradient scaler, the loss on the logits upcast to f32): ".logits", ".loss",
#    ".grad.<p>" for R18_KEYS, as PyTorch's own bf16 kernels compute them (minidl's --amp bf16).
#  The model stages are computed in float64 from the float32 input and weights and stored as
#  float32 (no float32 rounding of their own); the script also runs them in float32 and fails if
#  PyTorch's own float32 differs from the float64 reference by more than a tenth of the C++
#  test's tolerance, so the test never compares an ill-conditioned number.
import os
import sys

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import write_safetensors  # noqa: E402  (the repo's dependency-free writer)
from make_golden_resnet import golden_value  # noqa: E402
from golden_images import golden_args, image_entries  # noqa: E402  (hash + samples of a photo stage)

SIZE = 64
PHOTOS = ["cat/cat.1.jpg", "cat/cat.183.jpg", "cat/cat.596.jpg", "cat/cat.835.jpg",
          "dog/dog.1.jpg", "dog/dog.11.jpg", "dog/dog.296.jpg", "dog/dog.927.jpg"]
LABELS = [0, 0, 0, 0, 1, 1, 1, 1]
R18_KEYS = ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.bn1.bias", "layer3.1.bn1.bias", "fc.weight", "fc.bias"]
SMALLCNN_KEYS = ["conv.weight", "conv.bias", "fc2.weight", "fc2.bias"]
SGD_LR, ADAM_LR = 0.1, 1e-3
# The C++ test's tolerances (relative to the largest magnitude of the reference); keep in sync
# with tests/e2e/e2e_golden_test.cpp.
TOL = {"logits": 1e-4, "loss": 1e-5, "grad": 2e-3, "sgd": 1e-4, "adam": 1e-4, "running_mean": 1e-4}
SETTINGS = ["center", "imagenet", "squash", "keras"]


def transform(img: Image.Image, setting: str) -> Image.Image:
    if setting == "center":
        return T.CenterCrop(SIZE)(T.Resize(SIZE)(img))
    if setting == "imagenet":
        return T.CenterCrop(SIZE)(T.Resize(round(SIZE * 256 / 224))(img))
    if setting == "squash":
        return T.Resize((SIZE, SIZE))(img)
    if setting == "keras":
        return img.resize((SIZE, SIZE), Image.NEAREST)
    raise ValueError(setting)


def make_formats(folder: str) -> list:
    """Small synthetic files in the formats the decoder must handle; returns their names."""
    os.makedirs(folder, exist_ok=True)
    h, w = 31, 45
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(19)
    rgb = np.stack([128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0), 255 * x / (w - 1), 255 * (x + y > 30)], -1)
    rgb = np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(rgb, "RGB")
    files = {
        "odd420.jpg": lambda p: im.save(p, quality=90, subsampling=2),
        "progressive.jpg": lambda p: im.save(p, quality=85, progressive=True),
        "gray.jpg": lambda p: im.convert("L").save(p, quality=90),
        "cmyk.jpg": lambda p: im.convert("CMYK").save(p, quality=90),
        "rgb.png": lambda p: im.save(p),
        "rgba.png": lambda p: Image.fromarray(np.dstack([rgb, (x * 5).astype(np.uint8)]), "RGBA").save(p),
        "gray.png": lambda p: im.convert("L").save(p),
        "palette.png": lambda p: im.convert("P", palette=Image.ADAPTIVE, colors=16).save(p),
    }
    for name, write in files.items():
        write(os.path.join(folder, name))
    return sorted(files)


class SmallCnn(torch.nn.Module):
    """nn/keras_cnn.h in PyTorch: conv 32 3x3 same + ReLU, max-pool 2, dense 128 + ReLU, dense 1."""

    def __init__(self, size: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * (size // 2) ** 2, 128)
        self.fc2 = torch.nn.Linear(128, 1)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))


def load_golden_weights(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for key, t in model.state_dict().items():
            t.copy_(golden_value(key, tuple(t.shape)))


def train_step(model, x, loss_fn, keys, dtype):
    """Forward + backward + the two optimizers' first steps from the same start, in dtype."""
    model = model.to(dtype).train()
    x = x.to(dtype)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    logits = model(x)
    loss = loss_fn(logits)
    loss.backward()
    params = dict(model.named_parameters())
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    for k in keys:
        out["grad." + k] = params[k].grad.detach().clone()
    for name, opt in (("sgd", torch.optim.SGD(model.parameters(), lr=SGD_LR)),
                      ("adam", torch.optim.Adam(model.parameters(), lr=ADAM_LR))):
        opt.step()
        for k in keys:
            out[name + "." + k] = params[k].detach().clone()
        with torch.no_grad():  # back to the start (and the same gradients) for the next optimizer
            for k, v in model.named_parameters():
                v.copy_(start[k])
    return out, model


def check_f32(name, ref64, got32):
    for k, r in ref64.items():
        stage = k.split(".")[0]
        tol = TOL[stage] / 10
        scale = max(float(r.abs().max()), 1e-30)
        err = float((got32[k].double() - r).abs().max()) / scale
        if err > tol:
            sys.exit(f"{name}.{k}: PyTorch float32 is {err:.2e} from float64 (budget {tol:.0e}): ill-conditioned")


def main() -> None:
    args = golden_args(__doc__, "e2e")
    torch.manual_seed(0)
    entries = {}
    for name in make_formats(os.path.join(args.out, "formats")):
        img = Image.open(os.path.join(args.out, "formats", name)).convert("RGB")
        entries.update(image_entries("decoded.formats/" + name, np.asarray(img), full=True))
    batch = {s: [] for s in SETTINGS}
    for rel in PHOTOS:
        img = Image.open(os.path.join(args.photos, rel)).convert("RGB")
        entries.update(image_entries("decoded." + rel, np.asarray(img), full=False))
        for s in SETTINGS:
            out = transform(img, s)
            assert out.size == (SIZE, SIZE), (rel, s, out.size)
            entries.update(image_entries(s + "." + rel, np.asarray(out), full=False))
            batch[s].append(out)
    labels = torch.tensor(LABELS)
    norm = T.Compose([T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    x_r18 = torch.stack([norm(im) for im in batch["center"]])
    entries["input.resnet18.mean"] = x_r18.double().mean(dim=(2, 3)).numpy()
    x_cnn = torch.stack([T.ToTensor()(im) for im in batch["keras"]])  # Keras' rescale 1/255
    entries["input.smallcnn.mean"] = x_cnn.double().mean(dim=(2, 3)).numpy()

    def run(name, make, x, loss_fn, keys):
        ref = None
        for dtype in (torch.float64, torch.float32):
            model = make()
            load_golden_weights(model)
            out, model = train_step(model, x, loss_fn, keys, dtype)
            if dtype == torch.float64:
                ref = out
                if name == "resnet18":
                    ref["running_mean.bn1"] = model.bn1.running_mean.detach().clone()
            else:
                if name == "resnet18":
                    out["running_mean.bn1"] = model.bn1.running_mean.detach().clone()
                check_f32(name, ref, out)
        for k, v in ref.items():
            entries[name + "." + k] = v.float().numpy()

    run("resnet18", lambda: torchvision.models.resnet18(num_classes=2), x_r18,
        lambda logits: torch.nn.functional.cross_entropy(logits, labels), R18_KEYS)
    # bf16 autocast: the same ResNet-18 step with f32 weights under
    # torch.autocast("cpu", dtype=torch.bfloat16), no gradient scaler; the loss in f32.
    model = torchvision.models.resnet18(num_classes=2)
    load_golden_weights(model)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x_r18)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    loss.backward()
    params = dict(model.named_parameters())
    entries["resnet18.bf16.logits"] = logits.detach().float().numpy()
    entries["resnet18.bf16.loss"] = loss.detach().reshape(1).numpy()
    for k in R18_KEYS:
        entries["resnet18.bf16.grad." + k] = params[k].grad.detach().float().numpy()
    run("smallcnn", lambda: SmallCnn(SIZE), x_cnn,
        lambda logits: torch.nn.functional.binary_cross_entropy_with_logits(
            logits.reshape(-1), labels.to(logits.dtype)), SMALLCNN_KEYS)
    entries["labels"] = np.array(LABELS, dtype=np.int64)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "e2e.safetensors")
    write_safetensors(path, {k: torch.from_numpy(np.array(v, copy=True)) for k, v in entries.items()},
                     {"photos": ",".join(PHOTOS), "size": str(SIZE), "torch": torch.__version__,
                      "torchvision": torchvision.__version__, "pil": Image.__version__})
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(entries)} tensors)")


if __name__ == "__main__":
    main()
