# trainer-jax: the planner's default image for framework jax (planner config
# `default_images.jax`). The framework, nats-py for the worker contract, and
# examples/train.py, which reports progress and checkpoints and obeys commands.
# Jobs with their own script set spec.image and spec.command.
#   docker build -f deploy/trainer/jax.Dockerfile -t <registry>/trainyard/trainer-jax:0.1.0 .
FROM python:3.12-slim-bookworm
RUN python3 -m pip install --no-cache-dir "nats-py==2.9.0" "jax[cuda12]==0.4.35"
COPY examples/train.py /opt/trainyard/train.py
USER 1000:1000
ENTRYPOINT ["python3", "/opt/trainyard/train.py"]
