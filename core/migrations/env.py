from alembic import context
from sqlalchemy import create_engine

from lanner.core import models  # noqa: F401  (registers the tables on Base.metadata)
from lanner.core.db import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")

if context.is_offline_mode():
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url)
    with engine.connect() as connection:
        # Batch mode lets later migrations alter columns on SQLite, which has no ALTER COLUMN.
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
