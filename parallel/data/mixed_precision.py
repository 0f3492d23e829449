"""Mixed-precision training: 16-bit forward and backward, master weights and dynamic loss scaling.

`MixedPrecision` keeps the weights, gradients and optimiser state of the model's
own dtype (float32: the *master* copy, the data-parallel trainer's vectors) and
re-binds the model to a 16-bit copy of the weights (`ComputeFormat`). Every step
of `parallel.data.data_parallel` casts the master weights to the copy, runs
forward and backward in the 16-bit format, turns the 16-bit weight gradients back
into master gradients, exchanges them, unscales them, and updates the master
weights. `FullPrecision` is the same interface without any of it (the model
computes on the master vectors), so the trainer calls either alike.

float16
    NumPy's native half type. Every array of forward and backward is float16; the
    loss and its gradient are computed in the master dtype from the logits. NumPy
    has no BLAS for float16: its GEMMs run in a generic loop (accumulating in
    float32, rounding the result) many times slower than float32 BLAS on the CPU,
    so float16 here saves memory, not time.
bfloat16
    NumPy has no bfloat16 dtype: it is emulated in float32 storage by rounding to
    bfloat16 precision (`parallel.data.gradient_wire.round_to_bfloat16`) the
    weights, the input, every layer's output, every backward output and the weight
    gradients. Products and sums inside a layer are float32, as in bfloat16 GEMMs
    with float32 accumulation. Same speed and memory as float32; it shows the
    numerical effect only.

Loss scaling (`LossScaler`)
    float16 loses gradients below 2**-24; the loss gradient is multiplied by a
    scale before backward, the gradients are exchanged scaled and divided by it
    afterwards. Dynamic scaling (float16's default): start at 2**16; a step whose
    reduced gradients hold an inf or NaN is skipped and the scale halved; after
    ``growth_interval`` finite steps in a row the scale doubles (the scheme of
    PyTorch's ``GradScaler``). bfloat16 has float32's exponent range: scale 1,
    never changed, overflowing steps still skipped. The test runs on the
    allreduced gradients, which every rank holds alike (an inf or NaN on one rank
    reaches every rank through the sum), so all ranks skip the same steps without
    another message.

Every operation is an array method, a ufunc or an assignment, so the same code
runs on NumPy and CuPy arrays (the storage stays in the arrays' module).
"""
import contextlib

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.data.gradient_wire import round_to_bfloat16
from parallel.nn.models import flat_storage

COMPUTE_FORMATS = ("full", "float16", "bfloat16")


class ComputeFormat:
    """The 16-bit format forward and backward run in.

    Parameters
    ----------
    name : {"float16", "bfloat16"}

    Attributes
    ----------
    dtype : numpy.dtype
        Storage of the model's copy: float16, or float32 holding bfloat16 values.
    emulated : bool
        True for bfloat16: values must be rounded explicitly (`round`).
    """

    def __init__(self, name):
        if name not in COMPUTE_FORMATS[1:]:
            raise InputError(f"unknown compute format {name!r}; choose from {', '.join(COMPUTE_FORMATS)}")
        self.name = name
        self.emulated = name == "bfloat16"
        self.dtype = np.dtype(np.float32 if self.emulated else np.float16)

    def input(self, x):
        """A new array of `dtype` holding ``x`` rounded to the format (the caller's ``x`` is kept)."""
        x = x.astype(self.dtype)
        return round_to_bfloat16(x) if self.emulated else x

    def round(self, values):
        """Round ``values`` (an array of `dtype` the caller owns) in place when emulated; return it."""
        return round_to_bfloat16(values) if self.emulated else values

    def cast(self, source, out):
        """Write ``source`` (master values) rounded to the format into ``out`` (of `dtype`)."""
        out[...] = source
        if self.emulated:
            round_to_bfloat16(out)

    def to_master(self, source, out):
        """Write the format's gradients ``source`` into the master array ``out`` (bfloat16: rounded first)."""
        if self.emulated:
            round_to_bfloat16(source)
        out[...] = source


class LossScaler:
    """Loss scale for 16-bit backward passes, dynamic (float16) or fixed.

    Parameters
    ----------
    scale : float
        Initial scale (> 0; a power of two keeps scaling exact).
    dynamic : bool
        Halve the scale on every overflow and double it after ``growth_interval``
        finite steps in a row; otherwise it never changes.
    growth_interval : int
        Finite steps in a row before the scale doubles (>= 1).

    Attributes
    ----------
    scale : float
    skipped_steps, steps : int
        Steps skipped for an overflow, and all steps seen.
    """

    GROWTH, BACKOFF = 2.0, 0.5

    def __init__(self, scale=2.0 ** 16, dynamic=True, growth_interval=2000):
        if not scale > 0 or not np.isfinite(scale) or int(growth_interval) != growth_interval or \
                growth_interval < 1:
            raise InputError(f"LossScaler: need a finite scale > 0 and an integer growth_interval >= 1, "
                             f"got {scale} and {growth_interval}")
        self.scale, self.dynamic, self.growth_interval = float(scale), bool(dynamic), int(growth_interval)
        self.skipped_steps = self.steps = 0
        self._good_steps = 0

    def update(self, finite):
        """Record one step whose gradients were ``finite`` (or not); return True when it may be applied."""
        self.steps += 1
        if not finite:
            self.skipped_steps += 1
            self._good_steps = 0
            if self.dynamic:
                self.scale *= self.BACKOFF
            return False
        self._good_steps += 1
        if self.dynamic and self._good_steps == self.growth_interval:
            self.scale *= self.GROWTH
            self._good_steps = 0
        return True


def default_scaler(name):
    """The loss scaler of compute format ``name``: dynamic from 2**16 for float16, fixed 1 for bfloat16."""
    return LossScaler() if name == "float16" else LossScaler(1.0, dynamic=False)


class FullPrecision:
    """Forward and backward in the model's own dtype: its vectors are the master ones (no copy, no scaling).

    Parameters
    ----------
    model : Layer
    master_grads : ndarray
        The model's flat gradient vector.
    loss : callable
        ``loss(logits, labels, batch_size) -> (value, dlogits)``.
    """

    loss_scaler = None

    def __init__(self, model, master_grads, loss):
        self.model, self.model_grads, self.loss = model, master_grads, loss

    def errors(self):
        """The floating-point error handling of a step: NumPy's own."""
        return contextlib.nullcontext()

    def sync_model(self):
        """Nothing to copy: the model computes on the master weights."""

    def forward(self, x):
        return self.model.forward(x)

    def loss_and_gradient(self, logits, y, batch_size):
        return self.loss(logits, y, batch_size)

    def round(self, dy):
        """A backward output as it is."""
        return dy

    def to_master(self, start=0, stop=None):
        """Nothing to widen: the model's gradients are the master gradients."""

    def unscale(self):
        """Return whether the step must be skipped: never."""
        return False


class MixedPrecision:
    """Forward and backward in a 16-bit `ComputeFormat` on a copy of the master weights, the loss scaled.

    Parameters
    ----------
    compute : {"float16", "bfloat16"}
    model : Layer
        Its parameters and gradients are the master vectors (`flat_storage`); it is
        re-bound to 16-bit copies of them (`model_params`, `model_grads`).
    master_params, master_grads : ndarray, shape (number of parameters,)
    loss : callable
        As `FullPrecision`'s; it gets the logits in the master dtype.
    loss_scaler : LossScaler, optional
        Default `default_scaler`.

    Attributes
    ----------
    format : ComputeFormat
    loss_scaler : LossScaler
    model_params, model_grads : ndarray, shape (number of parameters,)
        The model's 16-bit copies (of `ComputeFormat.dtype`).
    """

    def __init__(self, compute, model, master_params, master_grads, loss, loss_scaler=None):
        self.format = ComputeFormat(compute)
        self.loss_scaler = loss_scaler or default_scaler(compute)
        self.model, self.loss = model, loss
        self.master_params, self.master_grads = master_params, master_grads
        self.model_params, self.model_grads = flat_storage(model, self.format.dtype)
        self._leaves = model.leaves()

    def errors(self):
        """Overflow is expected now and then: it is detected (`unscale`) and the step skipped, silently."""
        return np.errstate(over="ignore", invalid="ignore")

    def sync_model(self):
        """Cast the master weights into the model's 16-bit copy."""
        self.format.cast(self.master_params, self.model_params)

    def forward(self, x):
        """Run forward layer by layer, the input and every output rounded to the format."""
        x = self.format.input(x)
        for layer in self._leaves:
            x = self.format.round(layer.forward(x))
        return x

    def loss_and_gradient(self, logits, y, batch_size):
        """The loss from master-dtype logits, and its gradient scaled and in the format."""
        value, dlogits = self.loss(logits.astype(self.master_params.dtype), y, batch_size)
        dlogits *= self.loss_scaler.scale
        return value, self.format.input(dlogits)

    def round(self, dy):
        """Round a backward output to the format in place; return it (None, a first layer's skipped input
        gradient, as it is)."""
        return dy if dy is None else self.format.round(dy)

    def to_master(self, start=0, stop=None):
        """Widen the model's gradients ``[start:stop]`` into the master gradients."""
        self.format.to_master(self.model_grads[start:stop], self.master_grads[start:stop])

    def unscale(self):
        """Divide the reduced master gradients by the loss scale; return whether the step must be skipped
        (a gradient not finite; the same on every rank, as the reduced gradients are)."""
        finite = bool(array_module(self.master_grads).isfinite(self.master_grads).all())
        self.master_grads *= 1 / self.loss_scaler.scale
        return not self.loss_scaler.update(finite)


def compute_precision(compute, model, master_params, master_grads, loss, loss_scaler=None):
    """`FullPrecision` for ``compute="full"`` (``loss_scaler`` ignored), else `MixedPrecision`."""
    if compute == "full":
        return FullPrecision(model, master_grads, loss)
    return MixedPrecision(compute, model, master_params, master_grads, loss, loss_scaler)
