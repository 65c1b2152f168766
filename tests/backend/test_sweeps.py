"""Sweeps through the API on SQLite and PostgreSQL: runs queued as ordinary jobs that take turns with
another user's, the ranking by a metric with the best marked, cancel, and refusals per field."""
from __future__ import annotations

from lanner.core import db
from lanner.core.models import JobMetric, JobStatus
from lanner.core.streams import QUEUE_STREAM, read_after

from backend_helpers import CHAT_ROWS, MODEL, field_errors, set_status, submit, upload

RATES = [1e-4, 2e-4, 3e-4, 4e-4, 5e-4]


def sweep(client, dataset, parameters, **fields):
    base = {"method": "lora", "model": MODEL, "dataset_id": dataset, "gpus": 0, **fields.pop("base", {})}
    return client.post("/api/sweeps", json={"base": base, "parameters": parameters, "metric": "loss", **fields})


def add_metrics(api, job_id, *rows):
    with db.session_factory(api.settings.database_url)() as session:
        session.add_all(JobMetric(job_id=job_id, step=step, values=values) for step, values in rows)
        session.commit()


def test_a_sweeps_runs_take_turns_with_another_users_job_and_are_ranked(team_on_each_database, wakes):
    team = team_on_each_database
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    created = sweep(team.alice, dataset, [{"field": "hyperparameters.learning_rate", "values": RATES},
                                          {"field": "lora.rank", "values": [4, 8, 16, 32]}], budget=20, name="grid")
    assert created.status_code == 201, created.text
    grid = created.json()
    assert grid["status"] == "queued" and len(grid["job_ids"]) == 20 and grid["runs_by_status"] == {"queued": 20}
    assert len(wakes) == 1  # one commit, one wake-up for the whole sweep
    assert [kind for _, kind, _ in read_after(team.api.redis, QUEUE_STREAM)] == ["added"] * 20
    first, second = (team.bob.get(f"/api/jobs/{job_id}").json() for job_id in grid["job_ids"][:2])
    assert first["sweep_id"] == grid["id"] and first["name"] == "grid #1 (learning_rate=0.0001, rank=4)"
    assert (first["config"]["hyperparameters"]["learning_rate"], first["config"]["lora"]["rank"]) == (1e-4, 4)
    assert (second["config"]["hyperparameters"]["learning_rate"], second["config"]["lora"]["rank"]) == (1e-4, 8)

    # Bob's job waits for one run of Alice's, not for twenty.
    bobs = submit(team.bob, dataset).json()
    assert bobs["queue_position"] == 2
    queued = [job["id"] for job in team.bob.get("/api/queue").json()["queued"]]
    assert queued == [grid["job_ids"][0], bobs["id"], *grid["job_ids"][1:]]

    best, worse, running = grid["job_ids"][:3]
    set_status(team.api, best, JobStatus.succeeded)
    set_status(team.api, worse, JobStatus.succeeded)
    set_status(team.api, running, JobStatus.running)
    add_metrics(team.api, best, (1, {"loss": 3.0}), (2, {"loss": 1.5, "grad_norm": 2.0}))
    add_metrics(team.api, worse, (1, {"loss": 1.0}), (2, {"loss": 2.5}))
    add_metrics(team.api, running, (1, {"loss": 0.5}))  # lowest so far, but not finished: ranked, not best
    ranking = team.bob.get(f"/api/sweeps/{grid['id']}/ranking").json()
    assert ranking["metric"] == "loss" and ranking["metrics"] == ["grad_norm", "loss"]
    top = [(run["job_id"], run["value"], run["rank"], run["best"]) for run in ranking["runs"][:4]]
    assert top == [(running, 0.5, 1, False), (best, 1.5, 2, True), (worse, 2.5, 3, False),
                   (grid["job_ids"][3], None, None, False)]
    assert ranking["runs"][1]["values"] == {"hyperparameters.learning_rate": 1e-4, "lora.rank": 4}
    by_norm = team.bob.get(f"/api/sweeps/{grid['id']}/ranking", params={"metric": "grad_norm",
                                                                         "direction": "maximize"}).json()
    assert [(run["job_id"], run["best"]) for run in by_norm["runs"][:2]] == [(best, True), (worse, False)]
    assert team.bob.get(f"/api/sweeps/{grid['id']}").json()["status"] == "running"
    assert [item["id"] for item in team.bob.get("/api/sweeps", params={"mine": True}).json()["items"]] == []
    assert team.bob.get("/api/sweeps").json()["total"] == 1
    assert team.bob.get("/api/sweeps/999").status_code == 404


def test_cancelling_a_sweep_cancels_its_queued_runs_and_lets_the_running_one_finish(team_on_each_database, wakes):
    team = team_on_each_database
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    three = sweep(team.alice, dataset, [{"field": "hyperparameters.learning_rate", "values": RATES[:3]}],
                  budget=3).json()
    done, running, queued = three["job_ids"]
    set_status(team.api, done, JobStatus.succeeded)
    set_status(team.api, running, JobStatus.running)
    assert team.bob.post(f"/api/sweeps/{three['id']}/cancel").status_code == 403
    cancelled = team.alice.post(f"/api/sweeps/{three['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "running" and cancelled.json()["cancelled_at"]
    assert cancelled.json()["runs_by_status"] == {"succeeded": 1, "running": 1, "cancelled": 1}
    assert team.alice.get(f"/api/jobs/{queued}").json()["status"] == "cancelled"
    again = team.alice.post(f"/api/sweeps/{three['id']}/cancel")
    assert again.status_code == 409 and again.json()["detail"] == f"Sweep {three['id']} is already cancelled"
    set_status(team.api, running, JobStatus.succeeded)
    assert team.alice.get(f"/api/sweeps/{three['id']}").json()["status"] == "cancelled"


def test_a_sweep_with_any_invalid_run_is_refused_per_field_and_queues_nothing(team, wakes):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    rate = {"field": "hyperparameters.learning_rate", "values": [1e-4, 5.0]}
    assert field_errors(sweep(team.alice, dataset, [rate], budget=2)) == {
        ("parameters", 0, "values"): "hyperparameters.learning_rate = 5.0: Input should be less than or equal to 1"}
    rank = {"field": "lora.rank", "values": [8]}
    assert "do not apply to full" in field_errors(sweep(team.alice, dataset, [rank], base={"method": "full"}))[
        ("parameters", 0, "values")]
    assert field_errors(sweep(team.alice, 999, [rank])) == {("base", "dataset_id"): "no dataset 999"}
    assert "only admins" in field_errors(sweep(team.alice, dataset, [rank], base={"priority": 5}))[("base", "priority")]
    over = field_errors(sweep(team.alice, dataset, [{**rate, "values": RATES}], budget=4))[()]
    assert "the grid has 5 runs, over the budget of 4" in over
    ranged = {"field": "hyperparameters.learning_rate", "low": 1e-5, "high": 1e-3, "log": True}
    assert "a grid takes values" in field_errors(sweep(team.alice, dataset, [ranged]))[()]
    assert "set hyperparameters.eval_fraction" in field_errors(sweep(team.alice, dataset, [rank], metric="eval_loss"))[()]
    assert ("parameters", 0, "field") in field_errors(sweep(team.alice, dataset, [{"field": "model", "values": ["x"]}]))
    assert team.alice.get("/api/jobs").json()["total"] == 0 and team.alice.get("/api/sweeps").json()["total"] == 0
    assert wakes == []

    random = sweep(team.alice, dataset, [ranged, {"field": "lora.rank", "values": [4, 8]}], strategy="random",
                   budget=3, seed=7)
    assert random.status_code == 201, random.text
    rates = [team.alice.get(f"/api/jobs/{job_id}").json()["config"]["hyperparameters"]["learning_rate"]
             for job_id in random.json()["job_ids"]]
    assert len(rates) == 3 and all(1e-5 <= rate <= 1e-3 for rate in rates)
