"""A job on more GPUs than any live machine has: refused at creation when the workers' heartbeats
say what the machines have; queued with the reason it waits when no worker is live."""
from __future__ import annotations

from lanner.core.messages.device import Device
from lanner.core.worker_registry import announce_worker

from backend_helpers import CHAT_ROWS, upload

MODEL = "builtin/SmolLM2-135M-Instruct"


def gpu(uuid: str, host: str) -> Device:
    # Two containers of one box (docker-compose replicas): their own host names, the box's machine.
    return Device(kind="cuda", name="H200", memory_total_bytes=140 * 2**30, index=0, id=uuid,
                  host=host, machine="GPU-a", memory_free_bytes=139 * 2**30)


def test_a_job_on_more_gpus_than_the_largest_machine_is_refused_or_waits_saying_why(team, wakes):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]

    def submit(gpus: int):
        return team.alice.post("/api/jobs", json={"method": "lora", "model": MODEL, "dataset_id": dataset,
                                                  "gpus": gpus})

    waiting = submit(4)  # no worker is live: nothing is known of the machines
    assert waiting.status_code == 201, waiting.text
    assert waiting.json()["status"] == "queued"
    assert waiting.json()["error"] == ("Waiting: needs 4 GPUs on one machine; no worker is running yet to say what "
                                       "a machine has.")

    redis = team.api.redis
    announce_worker(redis, "gpu@c1", gpu("GPU-a", "c1"))
    announce_worker(redis, "gpu@c2", gpu("GPU-b", "c2"))
    announce_worker(redis, "cpu0@laptop", Device(kind="cpu", name="cpu", memory_total_bytes=2**34,
                                                 id="cpu:cpu0@laptop", host="laptop"))
    refused = submit(4)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "gpus"]
    assert "asks for 4 GPUs on one machine, but the largest machine has 2" in refused.json()["detail"][0]["msg"]
    fits = submit(2)
    assert fits.status_code == 201 and fits.json()["error"] is None, fits.text
    assert submit(1).status_code == 201
    assert len(wakes) == 3
