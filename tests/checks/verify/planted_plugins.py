"""Datasets and models with planted bottlenecks, loaded by verify's child through --dataset/--model.

Each is a real workload, not a mock of the tool: the child trains on it and the verdict has to come out of the
measurements. Imported in the child only (torch is imported inside the factories).
"""

from __future__ import annotations

import atexit
import os
import tempfile
import time
from typing import Any

import numpy as np

SIDE = 16  # 16 x 16 x 3 uint8 images: cheap to make, cheap to train on


class Patterned:
    """Class ``i % 4`` as a bright quadrant plus noise: learnable in a dozen steps."""

    num_classes = 4

    def __init__(self, length: int = 100_000) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def image(self, i: int) -> tuple[np.ndarray, int]:
        label = i % 4
        img = np.random.default_rng(i).integers(0, 64, (SIDE, SIDE, 3), dtype=np.uint8)
        r, c = divmod(label, 2)
        img[r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] += 150
        return img, label

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.image(int(i))


class Sleepy(Patterned):
    """Every item waits 4 ms, as a read from a slow network disk would: no CPU, just latency."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        time.sleep(0.004)
        return self.image(int(i))


class Busy(Patterned):
    """Every item burns ~10 ms of CPU, as decoding and augmenting a large JPEG would."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        end = time.thread_time() + 0.010
        x = 0
        while time.thread_time() < end:
            x += 1
        return self.image(int(i))


class Entropy(Patterned):
    """Noise from the OS entropy pool on every read: no saved RNG state can reproduce it."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        img, label = self.image(int(i))
        return (img + np.random.default_rng().integers(0, 60, img.shape, dtype=np.uint8)).astype(np.uint8), label


class Mapped:
    """256 x 256 x 3 samples read from a memory-mapped uint8 file, as a staged images.npy is (the template's
    reader): a read is one copy, and with worker processes every batch is copied once more into shared memory
    for the hand-off, which costs more than the read."""

    num_classes = 4

    def __init__(self, length: int = 256, side: int = 256) -> None:
        fd, self.path = tempfile.mkstemp(suffix=".npy", prefix="planted-mapped-")
        os.close(fd)
        atexit.register(os.unlink, self.path)  # in the training child; forked workers leave without atexit
        rows = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.uint8, shape=(length, side, side, 3))
        rows[:] = np.random.default_rng(0).integers(0, 255, rows.shape[1:], dtype=np.uint8)
        rows.flush()
        del rows
        self.length = length
        self._rows: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        if self._rows is None:  # opened in the process that reads, as templates/staged_dataset.py does
            self._rows = np.load(self.path, mmap_mode="c")
        return torch.from_numpy(self._rows[int(i)]), int(i) % 4


def patterned() -> Patterned:
    return Patterned()


def sleepy() -> Sleepy:
    return Sleepy()


def busy() -> Busy:
    return Busy()


def entropy() -> Entropy:
    return Entropy()


def mapped() -> Mapped:
    return Mapped()


def strided_model() -> Any:
    """The tiny model on every 16th pixel of a 256 x 256 image: almost free, so only the loader can be slow."""
    model = tiny_model()
    forward = model.forward
    model.forward = lambda x: forward(x[:, ::16, ::16, :])
    return model


def tiny_model() -> Any:
    """A linear classifier over the raw pixels: a step costs well under a millisecond."""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(SIDE * SIDE * 3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.flatten(1).float() / 255)

    return Tiny()


def slow_model() -> Any:
    """The tiny model with a forward pass that takes ``SMOKE_STEP_S`` seconds (default 1): a model too large for the
    box, whose steps take seconds (a 224 px photo model took 7.5 s a step on a crowded box). A sleep, not CPU work, so the
    step's time holds on a busy shared box."""
    model = tiny_model()
    forward = model.forward
    seconds = float(os.environ.get("SMOKE_STEP_S", "1.0"))

    def slow(x: Any) -> Any:
        time.sleep(seconds)
        return forward(x)

    model.forward = slow
    return model


def slow_fsync_model() -> Any:
    """The tiny model, in a process whose fsync takes 250 ms: a checkpoint directory on a slow network mount.

    No FUSE or device-mapper needed: the checkpoint code calls ``os.fsync`` for the file and for the directory,
    and this replaces it in the child process only (the test process is untouched).
    """
    real = os.fsync

    def slow(fd: Any) -> None:
        time.sleep(0.25)
        real(fd)

    os.fsync = slow
    return tiny_model()


OOM_ABOVE_ENV = "PLANTED_OOM_ABOVE"  # the batch size above which oom_model runs out of memory (default 8)


def oom_model() -> Any:
    """The tiny model, raising torch's OutOfMemoryError above 8 samples per batch (``PLANTED_OOM_ABOVE``): a GPU's
    memory limit, on the CPU."""
    import torch

    model = tiny_model()
    forward = model.forward
    above = int(os.environ.get(OOM_ABOVE_ENV, "8"))

    def limited(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > above:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (planted by the test)")
        return forward(x)

    model.forward = limited
    return model


def nan_model() -> Any:
    """The tiny model with a NaN in every output: the gate must fail on the loss."""
    import torch

    model = tiny_model()
    forward = model.forward
    model.forward = lambda x: forward(x) * torch.tensor(float("nan"))
    return model


PHOTO_ROOT_ENV = "SMOKE_PHOTO_ROOT"  # the test writes an ImageFolder tree of real photos and names it here


class PhotoFolder:
    """An ImageFolder of real JPEG photos (``root/<class>/<file>.jpg``), decoded with PIL on every read.

    ``augment``: torchvision-style random augmentation written with PIL and torch's global RNG (as torchvision's
    transforms draw it): RandomResizedCrop, RandomHorizontalFlip, ColorJitter's brightness. In DataLoader workers
    that RNG is the worker's, seeded from the loader's base seed when the iterator starts. Without ``augment``:
    a fixed centre crop, the same bytes on every read.
    """

    def __init__(self, root: str, augment: bool, side: int = SIDE) -> None:
        from pathlib import Path

        folders = sorted(p for p in Path(root).iterdir() if p.is_dir())
        self.classes = [p.name for p in folders]
        self.files = [(str(f), k) for k, p in enumerate(folders) for f in sorted(p.glob("*.jpg"))]
        self.augment, self.side = augment, side

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        path, label = self.files[int(i)]
        with Image.open(path) as im:
            rgb = im.convert("RGB")
        out = self.random(rgb) if self.augment else self.fixed(rgb)
        return np.asarray(out, dtype=np.uint8), label

    def fixed(self, im: Any) -> Any:
        s = min(im.size)
        left, top = (im.width - s) // 2, (im.height - s) // 2
        return im.resize((self.side, self.side), box=(left, top, left + s, top + s))

    def random(self, im: Any) -> Any:
        import math

        import torch
        from PIL import Image, ImageEnhance

        area = im.width * im.height * float(torch.empty(1).uniform_(0.3, 1.0))
        ratio = math.exp(float(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3))))
        w = max(1, min(im.width, round(math.sqrt(area * ratio))))
        h = max(1, min(im.height, round(math.sqrt(area / ratio))))
        left = int(torch.randint(0, im.width - w + 1, (1,)))
        top = int(torch.randint(0, im.height - h + 1, (1,)))
        out = im.resize((self.side, self.side), box=(left, top, left + w, top + h))
        if float(torch.rand(1)) < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return ImageEnhance.Brightness(out).enhance(float(torch.empty(1).uniform_(0.6, 1.4)))


def photos_augmented() -> PhotoFolder:
    return PhotoFolder(os.environ[PHOTO_ROOT_ENV], augment=True)


def photos_fixed() -> PhotoFolder:
    return PhotoFolder(os.environ[PHOTO_ROOT_ENV], augment=False)


def forgetful_model() -> Any:
    """The tiny model with state outside ``state_dict``: a step counter kept as a non-persistent buffer that
    scales the logits (as a warm-up schedule kept in such a buffer would). A checkpoint cannot restore it."""
    import torch

    model = tiny_model()
    model.register_buffer("calls", torch.zeros(()), persistent=False)
    forward = model.forward

    def counted(x: torch.Tensor) -> torch.Tensor:
        model.calls += 1
        return forward(x) * (1 + 0.05 * model.calls)

    model.forward = counted
    return model


# --- measured advice: pipelines whose best loader setting is known from their cost ----------


class Compose:
    """torchvision.transforms.Compose's shape (a ``.transforms`` list applied in order), which verify times step
    by step; written here because torchvision is not installed for the CPU torch."""

    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, im: Any) -> Any:
        for t in self.transforms:
            im = t(im)
        return im


class ColorJitter:
    """Brightness and contrast by random factors from torch's global RNG (as torchvision draws them)."""

    def __call__(self, im: Any) -> Any:
        import torch
        from PIL import ImageEnhance

        b, c = (float(v) for v in torch.empty(2).uniform_(0.7, 1.3))
        return ImageEnhance.Contrast(ImageEnhance.Brightness(im).enhance(b)).enhance(c)


class GaussianBlur:
    """A Gaussian blur of the whole photo with a random radius of 2-4 px: the expensive step."""

    def __call__(self, im: Any) -> Any:
        import torch
        from PIL import ImageFilter

        return im.filter(ImageFilter.GaussianBlur(2 + 2 * float(torch.rand(1))))


class RandomResizedCrop:
    """A random crop of 50-100% of the shorter side, resized to SIDE x SIDE."""

    def __call__(self, im: Any) -> Any:
        import torch

        s = int(min(im.size) * (0.5 + 0.5 * float(torch.rand(1))))
        left = int(torch.randint(0, im.width - s + 1, (1,)))
        top = int(torch.randint(0, im.height - s + 1, (1,)))
        return im.resize((SIDE, SIDE), box=(left, top, left + s, top + s))


class ToArray:
    def __call__(self, im: Any) -> np.ndarray:
        return np.asarray(im, dtype=np.uint8)


ADVICE_PHOTOS = ("rocket.jpg", "astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png")


class BlurredPhotos:
    """An ImageFolder-like set of real JPEG photos (scikit-image's, 300-740 px), decoded with PIL on every read
    and augmented by ``transform`` (ColorJitter, GaussianBlur, RandomResizedCrop): ~20 ms of CPU per sample, so
    more worker processes are faster, up to the cores.

    The 60 files are read ``passes`` times an epoch (index modulo the files): with an epoch of 60 samples (under 4
    batches of 16) every worker started each epoch empty and the two workers' run used 132% of 2 cores, measuring 1.1-1.4x
    over none where a long epoch measures 1.9x."""

    num_classes = 4

    def __init__(self, copies: int = 12, passes: int = 16) -> None:
        import shutil

        from tests.datasets.photos import encode, photo

        self.root = tempfile.mkdtemp(prefix="planted-photos-")
        atexit.register(shutil.rmtree, self.root, True)
        self.files = []
        for k in range(copies * len(ADVICE_PHOTOS)):
            im = photo(ADVICE_PHOTOS[k % len(ADVICE_PHOTOS)])
            path = os.path.join(self.root, f"{k:04d}.jpg")
            with open(path, "wb") as fh:
                fh.write(encode(im.rotate(180) if k % 2 else im, quality=90))
            self.files.append(path)
        self.transform = Compose([ColorJitter(), GaussianBlur(), RandomResizedCrop(), ToArray()])
        self.passes = passes

    def __len__(self) -> int:
        return self.passes * len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(self.files[int(i) % len(self.files)]) as im:
            rgb = im.convert("RGB")
        return self.transform(rgb), int(i) % 4


def blurred_photos() -> BlurredPhotos:
    return BlurredPhotos()


class Windows:
    """Token windows of 32 from a repeating sequence of 256 tokens, as a tokenised corpus stored narrow would give
    (``dtype``: int32, int16, uint16): the next token is predictable, so the loss falls."""

    vocab_size = 256
    seq_len = 32

    def __init__(self, dtype: str, length: int = 10_000) -> None:
        self.dtype, self.length = np.dtype(dtype), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        seq = ((int(i) * 7 + np.arange(self.seq_len + 1) * 3) % self.vocab_size).astype(self.dtype)
        return seq[:-1], seq[1:]


def tokens_int32() -> Windows:
    return Windows("int32")


def tokens_int16() -> Windows:
    return Windows("int16")


def tokens_uint16() -> Windows:
    return Windows("uint16")


def token_model() -> Any:
    """A user's language model over ``Windows``: embedding, one linear layer, logits [B, T, V]."""
    import torch
    from torch import nn

    class Bigram(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.out = nn.Embedding(Windows.vocab_size, 32), nn.Linear(32, Windows.vocab_size)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids.long()))

    return Bigram()


def photos_from(root: str, augment: bool = True) -> PhotoFolder:
    """A dataset factory that needs arguments: verify calls --dataset with none, so this is a usage error."""
    return PhotoFolder(root, augment)


# --- several processes (verify --nproc): planted per rank through torch.distributed's rank ---

WIDE_FLOATS = 8_000_000  # 32 MB of fp32 gradients per step for a forward that costs a few milliseconds


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _planted(per_forward: Any, extra: int = 0) -> Any:
    """The tiny model, calling ``per_forward(calls)`` before each forward; ``extra`` more parameters that only
    add their gradient bytes (their sum times zero joins the logits)."""
    import torch
    from torch import nn

    class Planted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(SIDE * SIDE * 3, 4)
            self.extra = nn.Parameter(torch.zeros(extra)) if extra else None
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            per_forward(self.calls)
            out = self.fc(x.flatten(1).float() / 255)
            return out + self.extra.sum() * 0 if self.extra is not None else out

    return Planted()


def wide_model() -> Any:
    """Many gradient bytes, little compute: the exchange, not the math, is the step (comm-bound)."""
    return _planted(lambda calls: None, WIDE_FLOATS)


def straggler_model() -> Any:
    """Rank 1 spends 40 ms more on every forward than the others: a throttled GPU among good ones."""
    return _planted(lambda calls: time.sleep(0.04) if _rank() == 1 else None)


def crashing_model() -> Any:
    """Rank 1 raises on its 4th forward (in warm-up or the measured steps): the others must be stopped."""

    def boom(calls: int) -> None:
        if _rank() == 1 and calls == 4:
            raise RuntimeError("planted failure on rank 1")

    return _planted(boom)


def hanging_model() -> Any:
    """Rank 1 blocks for an hour on its 4th forward: the others wait in the all-reduce; the run must stall out."""
    return _planted(lambda calls: time.sleep(3600) if _rank() == 1 and calls == 4 else None)
