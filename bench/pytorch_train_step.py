"""One training step of bench/pytorch_utilization.py, run eagerly or replayed from a CUDA graph.

Why a file of its own: minidl's utilization study replays each step from a CUDA graph on a GPU (its
default there), so PyTorch's baseline needs the same mode to be like for like, and the two modes
must do the same work per step, which is easiest to see side by side:
  - the batch is gathered on the host by the caller and copied to the device (pageable memory);
  - forward under autocast when AMP is on, the loss in f32, the loss and the count of correct
    predictions read on the host (two syncs), backward through the gradient scaler, the optimizer's
    step and the scaler's update.
Eager (EagerStep): all of it every step, the loss read before the backward, as minidl's eager step.
Graphed (GraphedStep, PyTorch's documented whole-network capture): the first step runs eagerly on
a side stream (cuDNN's autotuning, the optimizer's state and the scaler's scale are made there, as
minidl's eager first step plans every shape); the second step captures forward, loss, prediction
count, backward, scaler and optimizer into one graph on static input tensors (gradients set to
None before it, so the captured backward writes them in the graph's pool), and every step from
the second on copies its batch into the static inputs, replays the graph, and reads the loss and
the count after the replay, as minidl reads them after its replay. The fused SGD takes the
scaler's found-inf flag and scale on the device, so nothing in the captured step syncs the host;
autocast's weight cache is off inside the capture, as PyTorch's notes on graphs and AMP advise.
"""
import contextlib


class EagerStep:
    def __init__(self, torch, model, opt, scaler, device, amp, amp_dtype, binary, channels_last):
        self.torch, self.model, self.opt, self.scaler, self.device = torch, model, opt, scaler, device
        self.amp, self.amp_dtype, self.binary, self.channels_last = amp, amp_dtype, binary, channels_last

    def forward_loss(self, x, y, cache=True):
        """(logits in f32, loss): the forward under autocast, the loss in f32 as minidl's Model::loss."""
        torch = self.torch
        if self.amp:
            ctx = torch.autocast(device_type=self.device.type, dtype=self.amp_dtype, cache_enabled=cache)
        else:
            ctx = contextlib.nullcontext()   # torch 1.13's CPU autocast refuses float16 even when disabled
        with ctx:
            logits = self.model(x)
        logits = logits.float()
        if self.binary:
            return logits, torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float().view(-1, 1))
        return logits, torch.nn.functional.cross_entropy(logits, y)

    def correct(self, logits, y):
        with self.torch.no_grad():
            pred = (logits.view(-1) > 0).long() if self.binary else logits.argmax(1)
            return (pred == y).sum()

    def to_device(self, x_host, y_host):
        x, y = x_host.to(self.device), y_host.to(self.device)
        if self.channels_last:
            x = x.contiguous(memory_format=self.torch.channels_last)
        return x, y

    def update(self, loss):
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def __call__(self, x_host, y_host):
        """One step on the host batch; returns the loss as a float."""
        x, y = self.to_device(x_host, y_host)
        logits, loss = self.forward_loss(x, y)
        loss_value = loss.item()
        int(self.correct(logits, y).item())   # minidl counts correct predictions every step: a second sync
        self.opt.zero_grad(set_to_none=True)
        self.update(loss)
        return loss_value


class GraphedStep(EagerStep):
    def __init__(self, *args):
        super().__init__(*args)
        self.steps = 0
        self.graph = None
        self.static = None   # (x, y, loss, correct): the captured step's inputs and outputs

    def _captured_body(self, x, y):
        logits, loss = self.forward_loss(x, y, cache=False)
        count = self.correct(logits, y)
        self.update(loss)
        return loss, count

    def __call__(self, x_host, y_host):
        torch = self.torch
        self.steps += 1
        if self.steps == 1:   # eagerly, on a side stream: autotuning and lazy state before the capture
            main = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                loss_value = EagerStep.__call__(self, x_host, y_host)
            main.wait_stream(side)
            return loss_value
        if self.graph is None:
            x, y = self.to_device(x_host, y_host)
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                loss, count = self._captured_body(x, y)
            self.static = (x, y, loss, count)
        x, y, loss, count = self.static
        x.copy_(x_host)   # host to device, into the static input's layout
        y.copy_(y_host)
        self.graph.replay()
        loss_value = loss.item()
        int(count.item())
        return loss_value
