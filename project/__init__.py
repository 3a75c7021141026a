"""Two classic CNN recipes (SimpleCNN on CIFAR-10, LeNet on MNIST) as a measured Lightning project."""

__version__ = "0.1.0"
