"""The `lanner` command: up (the whole studio), api, worker, migrate, import-default-model, admin,
build-llama-cpp; train (one job here, headless), submit and export (on a running studio)."""
from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from lanner.core.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lanner", description="Lanner fine-tuning studio")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start the whole studio: Redis if needed, the API, one worker per GPU")
    commands.add_parser("api", help="run the API server alone (for containers)")
    worker = commands.add_parser("worker", help="run a worker host: one worker per GPU (or one CPU worker) against "
                                                "the studio's database and Redis; SIGTERM drains it")
    worker.add_argument("--gpu", default=None,
                        help="run one worker alone (a container per GPU), on this GPU index or UUID, or 'claim' "
                             "to take the first GPU no other worker holds")
    worker.add_argument("--name", default="worker", help="with --gpu: the worker's name; @LANNER_HOST_NAME is appended")
    commands.add_parser("migrate", help="bring the database schema to the latest version")
    commands.add_parser("import-default-model", help="import the built-in SmolLM2 into the data dir")
    build = commands.add_parser("build-llama-cpp", help="install llama.cpp (llama-cpp-python compiles it; `up` "
                                                        "starts this in the background), or wait for the build under way")
    build.add_argument("--log", type=Path, default=None, help="the build's output (default: DATA_DIR/logs)")
    admin = commands.add_parser("admin", help="recover access without the API: promote a user, reset a password")
    admin_actions = admin.add_subparsers(dest="action", required=True)
    admin_actions.add_parser("promote", help="make EMAIL an active admin").add_argument("email")
    admin_actions.add_parser("reset-password", help="set EMAIL's password (asked for, or the first line of "
                                                    "standard input) and end their sessions").add_argument("email")
    train = commands.add_parser("train", help="train one job in the foreground on this machine, without the studio")
    train.add_argument("config", type=Path, help="a job spec YAML (a job page's 'Download YAML'), or an Axolotl "
                                                 "or LLaMA-Factory config")
    train.add_argument("--dataset", type=Path, required=True, help="the dataset file (.jsonl, .json, .csv, ...)")
    train.add_argument("--out", type=Path, default=Path("lanner-out"),
                       help="a new or empty folder for the adapter or model and the checkpoints (default: lanner-out)")
    studio = argparse.ArgumentParser(add_help=False)
    studio.add_argument("--url", default=os.environ.get("LANNER_URL", "http://127.0.0.1:8000"),
                        help="the studio (default: LANNER_URL or http://127.0.0.1:8000)")
    studio.add_argument("--token", default=os.environ.get("LANNER_TOKEN"),
                        help="an API token (default: LANNER_TOKEN)")
    submit = commands.add_parser("submit", parents=[studio],
                                 help="queue a job spec YAML on a running studio and follow it until it ends")
    submit.add_argument("config", type=Path)
    data = submit.add_mutually_exclusive_group()
    data.add_argument("--dataset", type=Path, help="upload this dataset file and train on it")
    data.add_argument("--dataset-id", type=int, help="train on this dataset of the studio (default: the spec's)")
    export = commands.add_parser("export", parents=[studio],
                                 help="export a finished training job on a running studio and follow it until it ends")
    export.add_argument("job", type=int, help="the training job's id")
    export.add_argument("--gguf", action="append", metavar="TYPE",
                        help="a GGUF type (q8_0, q4_k_m, f16, ...); repeat for several (default: q8_0)")
    export.add_argument("--no-gguf", action="store_true", help="no GGUF file")
    export.add_argument("--no-adapter", action="store_true", help="no adapter in PEFT's layout")
    export.add_argument("--no-merged", action="store_true", help="no merged 16-bit model")
    export.add_argument("--no-verify", action="store_true", help="skip the checks of the files against the model")
    args = parser.parse_args(argv)
    settings = get_settings()

    if args.command == "up":
        from lanner.cli.stack import up

        up(settings)
    elif args.command == "api":
        from lanner.cli.stack import start_builtin_import
        from lanner.core import db

        settings.ensure_dirs()
        db.migrate(settings.database_url)
        importer = start_builtin_import(settings)  # goes on in the background while the API answers
        if importer is not None:  # uvicorn reaps no children of its own: a thread waits for this one
            threading.Thread(target=importer.wait, name="builtin-import-reaper", daemon=True).start()
        import uvicorn

        uvicorn.run("lanner.backend.app:create_app", factory=True, host=settings.host, port=settings.port)
    elif args.command == "worker":
        from lanner.cli.worker_host import preflight, run_one_worker, run_worker_host

        settings.ensure_dirs()
        if args.gpu is None:
            raise SystemExit(run_worker_host(settings))
        preflight(settings)
        if args.gpu == "claim":
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LANNER_GPU_CLAIM"] = _claim_a_gpu(settings)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu
        run_one_worker(settings, args.name)
    elif args.command == "migrate":
        from lanner.core import db

        settings.ensure_dirs()
        db.migrate(settings.database_url)
        print(f"Database at revision {db.head_revision()}.")
    elif args.command == "import-default-model":
        from lanner.core.default_model import imported_model_dir

        settings.ensure_dirs()
        print(imported_model_dir(settings.models_dir))
    elif args.command == "build-llama-cpp":
        from lanner.cli.llama_cpp_build import LOG_NAME, build, say_status

        settings.ensure_dirs()
        status = build(args.log or settings.logs_dir / LOG_NAME)
        print(say_status(status), flush=True)
        if status.state != "ready":
            if status.log and Path(status.log).is_file():
                print("End of the log:\n" + Path(status.log).read_text(errors="replace")[-3000:], flush=True)
            raise SystemExit(1)
    elif args.command == "admin":
        from lanner.cli.admin import run

        run(settings, args.action, args.email)
    elif args.command == "train":
        from lanner.cli.local_train import train

        raise SystemExit(train(args.config, args.dataset, args.out))
    elif args.command == "submit":
        from lanner.cli.remote import submit

        raise SystemExit(submit(args.config, args.url, args.token, args.dataset, args.dataset_id))
    elif args.command == "export":
        from lanner.cli.remote import export, export_options

        raise SystemExit(export(args.job, args.url, args.token, export_options(args)))


def _claim_a_gpu(settings) -> str:
    from lanner.core.redis_client import get_redis
    from lanner.core.worker_registry import claim_gpu
    from lanner.worker.devices import gpu_uuids

    uuids = gpu_uuids()
    if not uuids:
        raise SystemExit("--gpu claim: this machine shows no GPU (is the NVIDIA runtime enabled for the container?).")
    claimed = claim_gpu(get_redis(settings.redis_url), uuids, f"{settings.host_name}:{os.getpid()}")
    if claimed is None:
        raise SystemExit(f"--gpu claim: all {len(uuids)} GPUs already have a worker; run fewer worker replicas.")
    return claimed


if __name__ == "__main__":
    main()
