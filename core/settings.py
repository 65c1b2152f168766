"""Settings, read from LANNER_* environment variables (the README has the table)."""
from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[1]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LANNER_", extra="ignore")

    data_dir: Path = Field(default=REPO_ROOT / "data", description="Models, datasets, artifacts, logs, the SQLite file")
    database_url: str = Field(default="", description="SQLAlchemy URL; empty means SQLite at DATA_DIR/lanner.db")
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Celery broker and event streams")
    host: str = Field(default="127.0.0.1", description="Address the API listens on")
    host_name: str = Field(default_factory=socket.gethostname, min_length=1, pattern=r"^[^@\s]+$",
                           description="This worker host's name in worker names (name@host), placement and "
                                       "the hardware page; unique per host")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the API listens on")
    frontend_dir: Path = Field(default=REPO_ROOT / "frontend" / "dist", description="Built web UI served at /")
    log_level: str = Field(default="info", description="debug, info, warning or error")
    max_upload_bytes: int = Field(default=20 * 1024**3, ge=1, description="Largest dataset file one upload may send")
    user_quota_bytes: int = Field(default=100 * 1024**3, ge=0, description="Total dataset bytes one user may keep")
    max_body_bytes: int = Field(default=1024**2, ge=1024, description="Largest JSON request body")
    session_days: int = Field(default=14, ge=1, description="How long a browser stays signed in")
    hub_url: str = Field(default="https://huggingface.co", description="Model hub searched by /api/models/search")
    hub_timeout_s: float = Field(default=5.0, gt=0, description="How long a hub request waits before answering offline")
    hub_token: str = Field(default="", description="Hugging Face access token, for gated and private models")
    local_model_dirs: str = Field(default="", description="Folders (separated by ':') local models may be read "
                                                          "from; empty: DATA_DIR/models")
    min_free_bytes: int = Field(default=1024**3, ge=0,
                                description="Disk space uploads and model downloads leave free (for checkpoints)")
    # Requests per minute, per user (per client address for sign-in), as a token bucket: bursts up
    # to the limit, then one more every 60/limit seconds.
    requests_per_minute: int = Field(default=600, ge=1, description="Any signed-in request")
    uploads_per_minute: int = Field(default=20, ge=1, description="Dataset uploads")
    jobs_per_minute: int = Field(default=60, ge=1, description="Jobs created, retried, cloned, exported")
    hub_requests_per_minute: int = Field(default=30, ge=1, description="Hub searches and model downloads")
    previews_per_minute: int = Field(default=60, ge=1, description="Dataset previews and token statistics")
    sign_ins_per_minute: int = Field(default=30, ge=1, description="Sign-in and setup attempts per client address")
    # Experiment trackers a job may choose (lanner.worker.training.trackers); TensorBoard and W&B
    # (offline) need nothing set up, MLflow a tracking server.
    public_url: str = Field(default="", description="The studio's address in links written to trackers; "
                                                    "empty: http://HOST:PORT")
    mlflow_tracking_uri: str = Field(default="", description="MLflow tracking server; empty: MLflow is not offered")
    mlflow_experiment: str = Field(default="lanner", min_length=1, description="MLflow experiment of the jobs' runs")
    wandb_project: str = Field(default="lanner", min_length=1, description="W&B project of the offline runs")
    # Notifications (docs/notifications.md): webhooks to private addresses (localhost, the LAN, cloud
    # metadata) are refused unless an admin allows them; e-mail goes through this SMTP server.
    webhook_private_targets: bool = Field(default=False, description="Allow webhooks to private, loopback and "
                                                                     "link-local addresses")
    smtp_host: str = Field(default="", description="SMTP server of notification e-mail; empty: no e-mail")
    smtp_port: int = Field(default=587, ge=1, le=65535, description="Port of the SMTP server")
    smtp_security: Literal["starttls", "tls", "none"] = Field(default="starttls", description="STARTTLS, TLS from "
                                                              "the first byte, or plain (a server on this machine)")
    smtp_username: str = Field(default="", description="SMTP user name; empty: no login")
    smtp_password: str = Field(default="", description="SMTP password")
    smtp_from: str = Field(default="", description="From address of notification e-mail; empty: lanner@HOST")
    # Storage (docs/storage.md): datasets, checkpoints and artifacts in the data dir (one box) or in an
    # S3-compatible object store that every host shares; a host keeps what it fetched in its cache.
    store: Literal["local", "s3"] = Field(default="local", description="Where datasets, checkpoints and artifacts "
                                          "live: the data dir, or an S3-compatible store (several hosts)")
    s3_bucket: str = Field(default="", description="Bucket of the S3 store")
    s3_prefix: str = Field(default="", description="Folder in the bucket the keys go under; empty: its top")
    s3_endpoint_url: str = Field(default="", description="Address of an S3-compatible server; empty: AWS")
    s3_region: str = Field(default="", description="Region of the bucket; empty: the client's default")
    s3_access_key_id: str = Field(default="", description="Access key of the S3 store; empty: boto3's usual "
                                                          "lookup (environment, ~/.aws, instance role)")
    s3_secret_access_key: str = Field(default="", description="Secret of that access key")
    cache_dir: Path | None = Field(default=None, description="This host's copies of store files (S3 store); "
                                                             "empty: DATA_DIR/cache")
    cache_max_bytes: int = Field(default=50 * 1024**3, ge=0, description="Most bytes the cache keeps; least "
                                                                        "recently used copies go first")
    store_retry_s: float = Field(default=900.0, ge=0, description="How long a store operation keeps retrying "
                                                                  "while the store is unreachable")

    @model_validator(mode="after")
    def _derive(self) -> "Settings":
        self.data_dir = self.data_dir.expanduser().resolve()
        self.cache_dir = (self.cache_dir or self.data_dir / "cache").expanduser().resolve()
        if self.store == "s3" and not self.s3_bucket:
            raise ValueError("LANNER_STORE=s3 needs LANNER_S3_BUCKET, the bucket to keep files in")
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'lanner.db'}"
        self.public_url = (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
        return self

    def job_page_url(self, job_id: int) -> str:
        """The job's page in the web UI, in links written outside it (trackers, notifications)."""
        return f"{self.public_url}/jobs/{job_id}"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def allowed_model_dirs(self) -> list[Path]:
        """LANNER_LOCAL_MODEL_DIRS resolved (symlinks too, so a path is compared with where it leads)."""
        given = [Path(folder).expanduser() for folder in self.local_model_dirs.split(":") if folder.strip()]
        return [folder.resolve() for folder in given or [self.models_dir]]

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    def ensure_dirs(self) -> None:
        for path in (self.data_dir, self.models_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> Settings:
    return Settings()
