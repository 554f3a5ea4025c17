-- A second database on the compose stack's Postgres for the MLflow tracking server (Prefect uses `prefect`).
CREATE DATABASE mlflow OWNER prefect;
