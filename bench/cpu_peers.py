#!/usr/bin/env python3
# The PyTorch and Keras side of bench/compare_cpu.sh: the same models as minidl's (the Keras study's
# small CNN, torchvision's ResNet-18/50 v1.5 with 2 classes), trained with plain SGD (lr 0.01) on
# random inputs, timed per step after warm-up, printed as one JSON line like minidl_bench_cpu_step's.
# `--flops` prints the training FLOPs per image of a model instead (counted on the PyTorch model).
import argparse
import json
import os
import resource
import statistics
import sys
import time


def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def timed_steps(step, warmup, steps, min_seconds):
    """Runs `warmup` untimed steps, then at least `steps` timed ones (more while under min_seconds)."""
    for _ in range(warmup):
        step()
    u0 = usage()
    times = []
    start = time.perf_counter()
    while len(times) < steps or (time.perf_counter() - start < min_seconds and len(times) < 50):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    u1 = usage()
    n = len(times)
    return times, {"user_s_per_step": (u1[0] - u0[0]) / n, "sys_s_per_step": (u1[1] - u0[1]) / n,
                   "minor_faults_per_step": (u1[2] - u0[2]) / n}


def report(framework, version, a, times, extra):
    med = statistics.median(times)
    out = {"framework": framework, "version": version, "model": a.model, "image_size": a.image_size,
           "batch": a.batch_size, "threads": a.threads, "steps": len(times), "step_s_median": med,
           "step_s_best": min(times), "images_per_s": a.batch_size / med}
    out.update(extra)
    print(json.dumps(out))


# ---------------------------------------------------------------- PyTorch

def torch_model(name, torch):
    import torchvision
    nn = torch.nn
    if name == "smallcnn":
        size = ARGS.image_size
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(32 * (size // 2) ** 2, 128), nn.ReLU(), nn.Linear(128, 1))
    return getattr(torchvision.models, name)(num_classes=2)


def run_torch(a):
    import torch
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model = torch_model(a.model, torch).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
    if a.memory_format == "channels_last":  # oneDNN's NHWC convolutions and batch norm
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    if a.model == "smallcnn":
        y = (torch.rand(a.batch_size, 1) > 0.5).float()
        loss_fn = torch.nn.BCEWithLogitsLoss()
    else:
        y = torch.randint(0, 2, (a.batch_size,))
        loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    times, extra = timed_steps(step, a.warmup, a.steps, a.min_seconds)
    extra["memory_format"] = a.memory_format
    report("pytorch", torch.__version__, a, times, extra)


def torch_flops(a):
    """Training FLOPs per image: 2 per multiply-add of every conv and linear layer, forward, weight
    gradient and input gradient (none for the first layer, whose input needs no gradient)."""
    import torch
    model = torch_model(a.model, torch).eval()  # eval: batch norm takes one image
    macs = []

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            macs.append(out.numel() * k)
        elif isinstance(mod, torch.nn.Linear):
            macs.append(out.numel() * mod.in_features)

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, 3, a.image_size, a.image_size))
    total = sum(3 * m for m in macs) - macs[0]
    conv = sum(3 * m for m in macs[:-1 if a.model != "smallcnn" else 1]) - macs[0]
    print(json.dumps({"model": a.model, "image_size": a.image_size, "train_flops_per_image": 2 * total,
                      "forward_flops_per_image": 2 * sum(macs), "conv_train_flops_per_image": 2 * conv}))


# ---------------------------------------------------------------- Keras (TensorFlow backend)

def keras_resnet(keras, name, size):
    L = keras.layers
    blocks, bottleneck = {"resnet18": ([2, 2, 2, 2], False), "resnet50": ([3, 4, 6, 3], True)}[name]

    def conv_bn(x, filters, k, stride, relu):
        x = L.Conv2D(filters, k, strides=stride, padding="same" if k > 1 else "valid", use_bias=False)(x)
        x = L.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)
        return L.ReLU()(x) if relu else x

    def pad_conv_bn(x, filters, k, stride, relu):
        # PyTorch pads k//2 on both sides; Keras 'same' pads asymmetrically when strided.
        if stride > 1 and k > 1:
            x = L.ZeroPadding2D(k // 2)(x)
            x = L.Conv2D(filters, k, strides=stride, padding="valid", use_bias=False)(x)
            x = L.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)
            return L.ReLU()(x) if relu else x
        return conv_bn(x, filters, k, stride, relu)

    inp = keras.Input((size, size, 3))
    x = pad_conv_bn(inp, 64, 7, 2, True)
    x = L.ZeroPadding2D(1)(x)
    x = L.MaxPooling2D(3, 2)(x)
    inplanes = 64
    for stage, n in enumerate(blocks):
        planes = 64 * 2 ** stage
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            out_planes = planes * (4 if bottleneck else 1)
            if bottleneck:
                h = conv_bn(x, planes, 1, 1, True)
                h = pad_conv_bn(h, planes, 3, stride, True)
                h = conv_bn(h, out_planes, 1, 1, False)
            else:
                h = pad_conv_bn(x, planes, 3, stride, True)
                h = conv_bn(h, planes, 3, 1, False)
            sc = x
            if stride != 1 or inplanes != out_planes:
                sc = L.Conv2D(out_planes, 1, strides=stride, use_bias=False)(x)
                sc = L.BatchNormalization(epsilon=1e-5, momentum=0.9)(sc)
            x = L.ReLU()(L.Add()([h, sc]))
            inplanes = out_planes
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(2)(x))


def run_keras(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    keras.utils.set_random_seed(0)
    L = keras.layers
    s = a.image_size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch_size, s, s, 3), dtype=np.float32)  # channels-last, Keras' own layout
    if a.model == "smallcnn":
        model = keras.Sequential([keras.Input((s, s, 3)), L.Conv2D(32, 3, padding="same", activation="relu"),
                                  L.MaxPooling2D(2), L.Flatten(), L.Dense(128, activation="relu"), L.Dense(1)])
        loss = keras.losses.BinaryCrossentropy(from_logits=True)
        y = (rng.random((a.batch_size, 1)) > 0.5).astype(np.float32)
    else:
        model = keras_resnet(keras, a.model, s)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        y = rng.integers(0, 2, (a.batch_size,))
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01), loss=loss)  # Keras' defaults otherwise
    xt, yt = tf.constant(x), tf.constant(y)

    def step():
        model.train_on_batch(xt, yt)

    times, extra = timed_steps(step, a.warmup, a.steps, a.min_seconds)
    extra["jit_compile"] = str(model.jit_compile)
    report("keras", f"tensorflow {tf.__version__}, keras {keras.__version__}", a, times, extra)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("framework", choices=["pytorch", "keras", "flops"])
    p.add_argument("--model", default="smallcnn", choices=["smallcnn", "resnet18", "resnet50"])
    p.add_argument("--image-size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--memory-format", default="nchw", choices=["nchw", "channels_last"],
                   help="PyTorch's layout of the model and the input (channels_last: oneDNN's NHWC kernels)")
    p.add_argument("--min-seconds", type=float, default=0.0, help="keep timing steps until this long (at most 50)")
    global ARGS
    ARGS = p.parse_args()
    {"pytorch": run_torch, "keras": run_keras, "flops": torch_flops}[ARGS.framework](ARGS)


if __name__ == "__main__":
    sys.exit(main())
