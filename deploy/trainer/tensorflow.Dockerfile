# trainer-tensorflow: the planner's default image for framework tensorflow (planner config
# `default_images.tensorflow`). The framework, nats-py for the worker contract, and
# examples/train.py, which reports progress and checkpoints and obeys commands.
# Jobs with their own script set spec.image and spec.command.
#   docker build -f deploy/trainer/tensorflow.Dockerfile -t <registry>/trainyard/trainer-tensorflow:0.1.0 .
FROM tensorflow/tensorflow:2.18.0-gpu
RUN python3 -m pip install --no-cache-dir "nats-py==2.9.0"
COPY examples/train.py /opt/trainyard/train.py
USER 1000:1000
ENTRYPOINT ["python3", "/opt/trainyard/train.py"]
