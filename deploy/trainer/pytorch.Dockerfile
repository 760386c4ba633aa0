# trainer-pytorch: the planner's default image for framework pytorch (planner config
# `default_images.pytorch`). The framework, nats-py for the worker contract, and
# examples/train.py, which reports progress and checkpoints and obeys commands.
# Jobs with their own script set spec.image and spec.command.
#   docker build -f deploy/trainer/pytorch.Dockerfile -t <registry>/trainyard/trainer-pytorch:0.1.0 .
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
RUN python3 -m pip install --no-cache-dir "nats-py==2.9.0"
COPY examples/train.py /opt/trainyard/train.py
USER 1000:1000
ENTRYPOINT ["python3", "/opt/trainyard/train.py"]
