"""Paddle's DatasetFolder / ImageFolder on a folder tree of real image files (Paddle's test_datasets.py cases)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fleetlite.vision.datasets import DatasetFolder, ImageFolder


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(0)
    files = ["class_0/abc.jpg", "class_0/def.png", "class_1/ghi.jpeg", "class_1/jkl.png", "class_1/mno/pqr.jpeg",
             "class_1/mno/stu.jpg"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / name)
    (tmp_path / "this_will_be_ignored.txt").write_text("not an image")
    (tmp_path / "class_1" / "notes.txt").write_text("not an image")
    return tmp_path


def test_dataset_folder_as_paddles_docstring(tree):
    ds = DatasetFolder(str(tree))
    assert ds.classes == ["class_0", "class_1"] and ds.class_to_idx == {"class_0": 0, "class_1": 1}
    assert [p[len(str(tree)) + 1:] for p, _ in ds.samples] == ["class_0/abc.jpg", "class_0/def.png",
                                                               "class_1/ghi.jpeg", "class_1/jkl.png",
                                                               "class_1/mno/pqr.jpeg", "class_1/mno/stu.jpg"]
    assert ds.targets == [0, 0, 1, 1, 1, 1] and len(ds) == 6
    img, label = ds[1]
    assert img.mode == "RGB" and img.size == (32, 32) and label == 0 and isinstance(label, int)
    only_jpg = DatasetFolder(str(tree), loader=lambda p: np.asarray(Image.open(p)), extensions=(".jpg",),
                             transform=lambda a: a.shape)
    assert len(only_jpg) == 2 and only_jpg[1] == ((32, 32, 3), 1)
    pngs = DatasetFolder(str(tree), is_valid_file=lambda p: p.endswith(".png"))
    assert pngs.targets == [0, 1]


def test_image_folder_returns_one_element_lists(tree):
    ds = ImageFolder(str(tree / "class_1"))
    assert len(ds) == 4 and [p.rsplit("/", 1)[1] for p in ds.samples] == ["ghi.jpeg", "jkl.png", "pqr.jpeg",
                                                                             "stu.jpg"]
    (img,) = ds[0]
    assert img.size == (32, 32)


def test_empty_folders_raise_runtime_error_as_paddle(tmp_path):
    with pytest.raises(RuntimeError, match="Found 0 files in subfolders of"):
        ImageFolder(str(tmp_path))
    with pytest.raises(RuntimeError, match="Found 0 files in subfolders of"):
        DatasetFolder(str(tmp_path))
    with pytest.raises(RuntimeError, match="is not a folder"):
        DatasetFolder(str(tmp_path / "missing"))
