"""Decoding one image file from elsewhere, as a person sees it, in bounded memory and bounded time.

Light on purpose (Pillow and NumPy only, no torch): :class:`BoundedDecoder`'s helper process imports this module
alone, so it starts in a fraction of a second.

**Memory**: a file that declares more than :data:`MAX_PIXELS` pixels (a "decompression bomb") is refused before any
pixel is decoded. **Time**: Pillow's decoders run in C and cannot be interrupted from Python, and some small files take
long to decode (a progressive JPEG of many scans: each scan passes over the whole picture). :class:`BoundedDecoder`
decodes in a helper process and kills it when one file takes more than :data:`DECODE_TIMEOUT_S` seconds: that file is
refused with a line naming it, and the next one gets a new helper. :func:`load_images` goes through one such helper
per process. **Formats**: only :data:`IMAGE_FORMATS` are opened, whatever a file's name says (Pillow's ``formats=``).

What "as a person sees it" means: :func:`as_seen` (EXIF orientation, 16-bit, transparency over white; see
:mod:`project.data.images`).
"""

from __future__ import annotations

import atexit
import collections
import signal
import socket
import subprocess  # nosec B404  # the decoding helper: this interpreter, a fixed command
import sys
import warnings
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from project.errors import UserError

# The formats Pillow may identify a file as, whatever its name: the documented ones only. Without ``formats=``
# Pillow tries every plugin it has, EPS among them, which starts Ghostscript on a PostScript file named cat.png.
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF", "PPM")  # PPM: also PGM, PBM
MAX_PIXELS = 4096 * 4096  # far above any recipe input; refused before decoding
BACKGROUND = "white"  # what transparent pixels are composited over
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
_ALPHA = {"LA", "La", "PA", "RGBA", "RGBa"}


def as_seen(img: Image.Image) -> Image.Image:
    """``img`` as a person sees it, as an 8-bit ``L`` or ``RGB`` image of the same size after EXIF rotation.

    16-bit modes are scaled (65535 -> 255, rounded), ``F`` is taken as 0.0..1.0, transparency is composited over
    :data:`BACKGROUND`, EXIF orientation is applied; see the module docstring.

    Raises:
        ValueError, OSError: Pillow cannot convert this mode.
    """
    img = ImageOps.exif_transpose(img)
    if img.mode in _SIXTEEN_BIT:
        wide = img.convert("I")
        img = wide.point(lambda v: v * (255 / 65535) + 0.5).convert("L")  # convert("L") clips
        if isinstance(key := wide.info.get("transparency"), int):  # a 16-bit transparent value: alpha from it
            img.info.pop("transparency", None)
            img.putalpha(Image.fromarray((np.asarray(wide) != key).astype(np.uint8) * 255))
    elif img.mode == "F":
        img = img.point(lambda v: v * 255).convert("L")  # F -> L rounds and clips
    if img.mode in _ALPHA or "transparency" in img.info:
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, BACKGROUND), rgba).convert("RGB")
    if img.mode not in ("L", "RGB"):
        img = img.convert("L" if img.mode in ("1", "L") else "RGB")  # "1" -> 0/255; P, CMYK, YCbCr -> RGB
    return img


def fit_to(img: Image.Image, size: tuple[int, int], resize: str = "stretch") -> Image.Image:
    """``img`` brought to ``size`` (W, H), bilinear: ``stretch`` scales the whole picture (aspect ratio not kept);
    ``crop`` scales it to cover ``size`` and cuts out the centre (torchvision's ``Resize`` + ``CenterCrop``); ``pad``
    scales it to fit inside and fills the rest with black (torchvision's ``Pad``, fill 0)."""
    if resize == "crop":
        return ImageOps.fit(img, size, Image.Resampling.BILINEAR)
    if resize == "pad":
        return ImageOps.pad(img, size, Image.Resampling.BILINEAR, color=0)
    return img.resize(size, Image.Resampling.BILINEAR)


def open_image(path: Path, mode: str, size: tuple[int, int], resize: str = "stretch") -> Image.Image:
    """Open ``path`` as a ``mode`` (``L`` or ``RGB``) image of ``size`` (W, H) pixels, as a person sees it
    (:func:`as_seen`), brought to that size by ``resize`` (:func:`fit_to`). The file is closed on return.

    Raises:
        UserError: not an image in one of :data:`IMAGE_FORMATS` (whatever its name says), truncated, or more than
            :data:`MAX_PIXELS` pixels.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=IMAGE_FORMATS) as img:
                if img.width * img.height > MAX_PIXELS:
                    raise UserError(f"{path}: {img.width}x{img.height} pixels is more than {MAX_PIXELS}; refused")
                img.load()
                return fit_to(as_seen(img).convert(mode), size, resize)
    except UnidentifiedImageError:
        raise UserError(f"{path}: not an image in a format predict reads ({', '.join(IMAGE_FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"{path}: refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{path}: unreadable image ({e})") from None


DECODE_TIMEOUT_S = 10.0  # seconds one file may take to decode (a 4096 x 4096 picture takes well under 1 s)
WINDOW = 64  # requests sent ahead of the helper's answers (each under 200 bytes: the pipe never fills with them)
_START_TIMEOUT_S = 120.0  # the helper's own start (an interpreter importing Pillow and NumPy), on a loaded machine


def _serve_fd(fd: int) -> None:
    """The helper process's entry point: :func:`_serve` on the socket ``fd`` its parent passed."""
    _serve(Connection(fd))


def _serve(conn: Connection) -> None:
    """The helper process: decode each ``(path, mode, size, resize)`` request with :func:`open_image` and send back
    ``("ok", mode, size, pixels)`` or ``("refused", message)``; ends when the parent's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it
    conn.send(("ready",))
    while True:
        try:
            path, mode, size, resize = conn.recv()
        except (EOFError, OSError):
            return
        try:
            image = open_image(Path(path), mode, size, resize)
            conn.send(("ok", image.mode, image.size, image.tobytes()))
        except UserError as e:
            conn.send(("refused", str(e)))


class BoundedDecoder:
    """:func:`open_image` in a helper process that is killed when one file takes more than ``timeout`` seconds.

    The helper is a fresh interpreter (``python -I``: the caller's threads and settings are not copied) that imports
    this module only; it starts at the first request and again after a kill, and ends with :meth:`close` or when this
    process's end of its socket closes (this process exiting, or killed).

    :meth:`load_all` yields, for each file it refuses, the :class:`~project.errors.UserError` naming it: not a
    readable image of :data:`IMAGE_FORMATS` within :data:`MAX_PIXELS`, or more than ``timeout`` seconds to decode.
    A helper that does not start within 120 s raises that error from :meth:`load_all`.
    """

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout
        self._process: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        # Not multiprocessing's spawn, which imports the caller's __main__ (python -m project.fit: torch, Lightning)
        # into the helper: a Python in isolated mode (-I: no PYTHON* variables, no user site) that imports this
        # module alone, from the folder this process imported it from, talking over a socket pair.
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[1])
        fd = theirs.fileno()
        code = f"import sys; sys.path.insert(0, {root!r}); from project.decode import _serve_fd; _serve_fd({fd})"
        try:  # this interpreter and a fixed command: nothing from input reaches it
            process = subprocess.Popen(  # nosec B603
                [sys.executable, "-I", "-c", code], pass_fds=(fd,), stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        if not conn.poll(_START_TIMEOUT_S):
            process.kill()
            process.wait()
            conn.close()
            raise UserError(f"the image decoding helper did not start within {_START_TIMEOUT_S:g} s")
        conn.recv()
        self._process, self._conn = process, conn
        return conn

    def load_all(
        self, paths: Iterable[Path], mode: str, size: tuple[int, int], resize: str = "stretch"
    ) -> Iterator[tuple[Path, Image.Image | UserError]]:
        """Each of ``paths``, in order, with ``open_image(path, mode, size, resize)``'s picture or the
        :class:`~project.errors.UserError` that refuses it. Requests go :data:`WINDOW` ahead, so that the helper never
        waits for the next one; the bound holds for each file (its picture must come within the bound of the
        previous one's). After a kill the files still asked for go to a new helper."""
        timeout = DECODE_TIMEOUT_S if self.timeout is None else self.timeout
        todo, asked = iter(paths), collections.deque[Path]()
        try:
            yield from self._answers(todo, asked, timeout, mode, size, resize)
        finally:
            if asked:  # left before every answer came (the caller stopped): answers must not reach the next caller
                self.close(kill=True)

    def _answers(
        self,
        todo: Iterator[Path],
        asked: collections.deque[Path],
        timeout: float,
        mode: str,
        size: tuple[int, int],
        resize: str,
    ) -> Iterator[tuple[Path, Image.Image | UserError]]:
        while True:
            conn = self._conn or self._start()
            while len(asked) < WINDOW and (path := next(todo, None)) is not None:
                conn.send((str(path), mode, size, resize))
                asked.append(path)
            if not asked:
                return
            path = asked.popleft()
            if not conn.poll(timeout):
                self._restart_with(asked, mode, size, resize)
                yield (
                    path,
                    UserError(f"{path}: decoding took more than {timeout:g} s; refused (built to decode slowly?)"),
                )
                continue
            try:
                reply = conn.recv()
            except EOFError:  # the helper died (killed from outside, out of memory)
                self._restart_with(asked, mode, size, resize)
                yield path, UserError(f"{path}: the image decoder ended while decoding it; refused")
                continue
            if reply[0] == "refused":
                yield path, UserError(reply[1])
            else:
                _, got_mode, got_size, pixels = reply
                yield path, Image.frombytes(got_mode, got_size, pixels)

    def _restart_with(self, asked: collections.deque[Path], mode: str, size: tuple[int, int], resize: str) -> None:
        """Kill the helper; a new one gets the requests the old one had not answered."""
        self.close(kill=True)
        if not asked:
            return
        conn = self._start()
        for path in asked:
            conn.send((str(path), mode, size, resize))

    def close(self, kill: bool = False) -> None:
        """End the helper (at once with ``kill``; else by closing its pipe)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if kill:
                process.kill()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


_decoder = BoundedDecoder()
atexit.register(_decoder.close)


def load_images(
    paths: Iterable[Path], mode: str, size: tuple[int, int], resize: str = "stretch"
) -> Iterator[tuple[Path, Image.Image | UserError]]:
    """:func:`open_image` of each of ``paths`` (as a person sees it, brought to ``size`` (W, H) by ``resize``),
    decoded within :data:`DECODE_TIMEOUT_S` seconds each, in order, pipelined through this process's helper
    (:meth:`BoundedDecoder.load_all`): each path with its picture or the :class:`~project.errors.UserError` that
    refuses it."""
    return _decoder.load_all(paths, mode, size, resize)
