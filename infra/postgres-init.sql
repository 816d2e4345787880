-- Prefect's own database beside the results database (created by POSTGRES_DB).
CREATE DATABASE prefect OWNER edgefarm;
