"""Images from the wild: ``predict`` reads what a person would call the same picture the same way, whatever its
mode (bit depth, palette, alpha, EXIF orientation, CMYK, 1-bit). Each variant is compared with the same picture
saved as a plain 8-bit ``L``/``RGB`` PNG."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image
from tiny_data import learnable_images

from project import predict
from project.data.images import open_image
from project.errors import UserError

RNG = np.random.default_rng(7)
PICTURE = learnable_images(np.array([3]), (28, 28), RNG)[0]  # uint8 (28, 28): noise and a bright stripe
PICTURE[0, 0], PICTURE[0, 1] = 0, 255  # both ends of the range
COLOUR = RNG.integers(0, 256, size=(28, 28, 3), dtype=np.uint8)
COLOUR[0, 0], COLOUR[0, 1] = 0, 255


def _seen(path, mode="L"):
    size = (28, 28)
    return np.asarray(open_image(path, mode, size)).astype(int)


def _save(img, path, **kw):
    img.save(path, **kw)
    return path


def _alpha():
    alpha = np.full((28, 28), 255, np.uint8)
    alpha[:, :7] = 0  # a transparent band: a person sees the background there
    return alpha


def variants(tmp):
    """{name: (file, the 8-bit picture a person sees in it: L (28, 28) or RGB (28, 28, 3) uint8)}."""
    a, c = PICTURE, COLOUR
    a16 = a.astype(np.uint16) * 257
    near = a16.copy()
    near[6, 0] = a16[5, 0] + 1  # the same 8-bit value as the transparent 16-bit one, but opaque
    white = np.where(_alpha() == 0, 255, a).astype(np.uint8)
    white_rgb = np.where(_alpha()[..., None] == 0, 255, c).astype(np.uint8)
    palette = Image.fromarray(a).convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    seen_palette = np.asarray(palette.convert("L"))
    transparent_index = int(np.asarray(palette)[5, 0])
    seen_tp = np.where(np.asarray(palette) == transparent_index, 255, seen_palette).astype(np.uint8)
    rotated = Image.fromarray(a).rotate(90, expand=True)  # stored sideways, EXIF says: rotate back
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the stored image is rotated 90 degrees counter-clockwise
    bits = (a > 127).astype(np.uint8) * 255
    return {
        name: (path, seen)
        for name, path, seen in [
            ("I;16 png", _save(Image.fromarray(a16), tmp / "i16.png"), a),
            (
                "I;16 png transparency",
                _save(Image.fromarray(near), tmp / "i16t.png", transparency=int(a16[5, 0])),
                np.where(near == a16[5, 0], 255, np.round(near / 257)).astype(np.uint8),
            ),
            ("I;16B tiff", _save(Image.frombytes("I;16B", (28, 28), a16.astype(">u2").tobytes()), tmp / "i16b.tif"), a),
            ("I ppm (16-bit)", _save(Image.fromarray(a16), tmp / "i16.pgm"), a),
            ("I tiff", _save(Image.fromarray(a16.astype(np.int32)), tmp / "i32.tif"), a),
            ("F tiff", _save(Image.fromarray(a.astype(np.float32) / 255), tmp / "f.tif"), a),
            ("P png", _save(palette, tmp / "p.png"), seen_palette),
            ("P png transparency", _save(palette, tmp / "pt.png", transparency=transparent_index), seen_tp),
            ("LA png", _save(Image.fromarray(np.dstack([a, _alpha()]), "LA"), tmp / "la.png"), white),
            ("RGBA png", _save(Image.fromarray(np.dstack([c, _alpha()]), "RGBA"), tmp / "rgba.png"), white_rgb),
            ("EXIF orientation", _save(rotated, tmp / "exif.png", exif=exif), a),
            ("CMYK tiff", _save(Image.fromarray(c).convert("CMYK"), tmp / "cmyk.tif"), c),
            ("1-bit png", _save(Image.fromarray(bits).convert("1"), tmp / "one.png"), bits),
        ]
    }


KINDS = [
    "I;16 png",
    "I;16 png transparency",
    "I;16B tiff",
    "I ppm (16-bit)",
    "I tiff",
    "F tiff",
    "P png",
    "P png transparency",
    "LA png",
    "RGBA png",
    "EXIF orientation",
    "CMYK tiff",
    "1-bit png",
]


@pytest.mark.parametrize("name", KINDS)
def test_every_mode_reads_as_the_same_picture_in_8_bit(name, tmp_path):
    """Issue 24 row 4's kind: the preprocessed picture equals that of the same picture saved as 8-bit L/RGB."""
    path, seen = variants(tmp_path)[name]
    reference = tmp_path / "reference.png"
    Image.fromarray(seen).save(reference)
    mode = "RGB" if seen.ndim == 3 else "L"
    got, want = _seen(path, mode), _seen(reference, mode)
    assert np.array_equal(got, want), (name, np.abs(got - want).max())
    if mode == "RGB":  # the CIFAR-10 path too, and the grayscale one from a colour picture
        assert np.array_equal(_seen(path, "L"), _seen(reference, "L")), name


def test_transparency_is_white_and_partial_alpha_blends_over_it(tmp_path):
    alpha = np.tile(np.array([0, 64, 128, 255], np.uint8), (28, 7))
    black = np.zeros((28, 28), np.uint8)
    Image.fromarray(np.dstack([black, alpha]), "LA").save(tmp_path / "la.png")
    got = _seen(tmp_path / "la.png")[0, :4]
    assert got.tolist() == [255, 191, 127, 0]  # 255 * (1 - alpha / 255), rounded


def test_16_bit_pngs_are_classified_as_their_8_bit_originals(trained_run, tmp_path, capsys):
    """Issue 24 row 4: 16-bit grayscale PNGs of test images were clipped (any value above 255 white), and 9 of 20
    labels differed from the same images saved as 8-bit. Now both give the same rows."""
    rng = np.random.default_rng(3)
    images = learnable_images(np.arange(20) % 10, (28, 28), rng)
    for bits in (8, 16):
        (tmp_path / f"b{bits}").mkdir()
        for i, image in enumerate(images):
            img = Image.fromarray(image) if bits == 8 else Image.fromarray(image.astype(np.uint16) * 257)
            img.save(tmp_path / f"b{bits}" / f"{i:02d}.png")
    assert Image.open(tmp_path / "b16" / "00.png").mode == "I;16"
    rows = {}
    for bits in (8, 16):
        out = tmp_path / f"p{bits}.csv"
        assert predict.main([str(trained_run), str(tmp_path / f"b{bits}"), "--out", str(out)]) == 0
        rows[bits] = [{k: v for k, v in r.items() if k != "path"} for r in csv.DictReader(out.open())]
    assert len(rows[8]) == 20 and rows[16] == rows[8]
    assert len({r["pred"] for r in rows[8]}) > 1  # the net tells these pictures apart: the check has teeth


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\nnewpath 0 0 moveto 28 28 lineto stroke\nshowpage\n%%EOF\n"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("cat.png", EPS),  # PostScript: Pillow's EPS plugin would start Ghostscript on it
        ("cat.jpg", None),  # a TGA under an image's name
        ("cat.gif", None),  # an ICO
    ],
)
def test_only_the_listed_formats_are_opened_whatever_the_name(name, content, tmp_path, monkeypatch):
    """An image is opened as one of the formats the docs list (PNG, JPEG, BMP, GIF, WebP, TIFF, PPM/PGM) or refused
    with one readable error; no other decoder runs, and no program is started."""
    import subprocess

    def no_program(*args, **kwargs):
        raise AssertionError(f"a program was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_program)
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    else:
        Image.new("L", (28, 28)).save(path, format="TGA" if name.endswith(".jpg") else "ICO")
    with pytest.raises(
        UserError, match=r"not an image in a format predict reads \(PNG, JPEG, BMP, GIF, WEBP, TIFF, PPM\)"
    ):
        open_image(path, "L", (28, 28))
    for fmt in ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF", "PPM"):  # the listed formats, under any name
        Image.new("L", (28, 28), 200).save(tmp_path / f"ok.{fmt}", format=fmt)
        assert open_image(tmp_path / f"ok.{fmt}", "L", (28, 28)).getpixel((3, 3)) in range(195, 206)


def test_a_small_file_that_decodes_slowly_is_refused_by_the_time_bound(tmp_path, monkeypatch):
    """A 58 KB PNG of 4096 x 4096 pixels takes about 0.4 s to decode and bring to 28 x 28 here; under a bound of
    0.1 s its helper process is killed and the file refused with a line naming it, and the next file decodes in a
    new helper (predict's scan, ImageFiles). In an image folder the same file stops the data with one DataError."""
    from tiny_data import make_image_folder

    import project.decode
    from project.data import ImageFolderDataModule
    from project.data.images import ImageFiles
    from project.errors import DataError

    slow, fine = tmp_path / "slow.png", tmp_path / "fine.png"
    Image.new("RGB", (4096, 4096), (120, 30, 200)).save(slow)
    Image.new("L", (8, 8), 200).save(fine)
    assert slow.stat().st_size < 100_000
    monkeypatch.setattr(project.decode, "DECODE_TIMEOUT_S", 0.1)
    dataset = ImageFiles([slow, fine, slow], (1, 28, 28), lambda image: np.asarray(image))
    assert dataset.files == [fine] and [path for path, _ in dataset.refused] == [slow, slow]
    assert all("decoding took more than 0.1 s; refused" in why for _, why in dataset.refused)
    assert dataset[0].shape == (28, 28) and (dataset[0] == 200).all()
    folder = make_image_folder(tmp_path / "images", per_class=4, splits=("train",))
    (folder / "train" / "cat" / "slow.png").write_bytes(slow.read_bytes())
    with pytest.raises(DataError, match=r"cat/slow\.png: decoding took more than 0\.1 s"):
        ImageFolderDataModule(data_dir=str(folder)).prepare_data()
    assert not (folder / ".cache").exists() or not list((folder / ".cache").glob("images-*.pt"))
