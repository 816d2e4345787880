# A farm worker: the project installed with its CPU torch pin; ssh client keys and the inventory are mounted.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git openssh-client && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/edgellm-farm
COPY . .
RUN pip install --no-cache-dir -c constraints.txt -e '.[s3]'
ENV EDGEFARM_HOME=/opt/edgellm-farm
