"""A short disk and a failure half-way leave nothing behind.

The disk is really small, not simulated: a 64 MB tmpfs mounted for the test (the box's tests run
as root; without the right to mount, the test is skipped with that reason). One test checks the
up-front size check (the export needs ~0.8 GB); one bypasses it to hit a real ENOSPC in the middle
of writing a GGUF; one cancels an export in the middle (the progress callback raises, as a runner's
cancel would) and finds no trace of it."""
from __future__ import annotations

import subprocess
import uuid

import pytest

from export_helpers import BASE_MODEL_NAME


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_short_disk_fails_before_writing_with_a_clear_error(small_disk, smollm2_dir, trained_adapter):
    from lanner.worker.export import ExportRequest, NotEnoughDiskSpace, run_export

    request = ExportRequest(base_model_dir=smollm2_dir, adapter_dir=trained_adapter, out_dir=small_disk / "job-2",
                            base_model_name=BASE_MODEL_NAME, gguf_types=("f16", "q4_k_m"))
    with pytest.raises(NotEnoughDiskSpace) as error:
        run_export(request)
    assert "Not enough disk space" in str(error.value) and error.value.needed > error.value.free
    assert list(small_disk.iterdir()) == []


def test_disk_full_while_writing_gguf_leaves_no_partial_file(small_disk, full_export):
    from lanner.worker.export import DiskFull, convert_to_gguf

    merged_dir = full_export["out"] / "merged"
    with pytest.raises(DiskFull, match="disk filled up while writing model-f16.gguf"):
        # the kernel refuses the write 64 MB into a 270 MB file
        convert_to_gguf(merged_dir, small_disk / "model-f16.gguf", out_type="f16", check_space=False)
    assert list(small_disk.iterdir()) == []


def test_quantize_on_a_full_disk_fails_cleanly(small_disk, full_export):
    from lanner.worker.export import ExportError, quantize_gguf

    f16 = full_export["out"] / "gguf" / "smollm2-lanner-f16.gguf"
    with pytest.raises(ExportError):
        quantize_gguf(f16, small_disk / "model-q8_0.gguf", "q8_0", check_space=False)
    assert list(small_disk.iterdir()) == []


def test_cancel_in_the_middle_leaves_nothing(tmp_path, smollm2_dir, trained_adapter):
    from lanner.worker.export import ExportRequest, run_export

    class Cancelled(Exception):
        pass

    def progress(stage, fraction):
        if stage == "merge" and fraction >= 0.95:  # the merged model is written, not yet renamed
            raise Cancelled

    parent = tmp_path / f"artifacts-{uuid.uuid4().hex[:6]}"
    parent.mkdir()
    request = ExportRequest(base_model_dir=smollm2_dir, adapter_dir=trained_adapter, out_dir=parent / "export",
                            base_model_name=BASE_MODEL_NAME, gguf_types=())
    with pytest.raises(Cancelled):
        run_export(request, progress=progress)
    assert list(parent.iterdir()) == []


def test_leftovers_of_a_killed_export_are_removed(tmp_path):
    """SIGKILL runs no cleanup; the next export into the same place (or the runner) removes the rest."""
    from lanner.worker.export import remove_partials

    final = tmp_path / "export"
    (tmp_path / ".export.partial-1234abcd").mkdir()
    (tmp_path / ".export.partial-1234abcd" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".model.gguf.partial-99").write_bytes(b"x")  # another artifact's: not touched
    assert [p.name for p in remove_partials(final)] == [".export.partial-1234abcd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.gguf.partial-99"]
