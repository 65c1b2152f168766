"""What the API and the workers share: settings, the database, the queue, the job spec, messages."""
