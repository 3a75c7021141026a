import pytest
import torch

from project.nets import LeNet, SimpleCNN, build_net


def n_params(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def test_parameter_counts_match_the_recipes():
    assert n_params(SimpleCNN()) == 332_778
    assert n_params(LeNet()) == 431_080


@pytest.mark.parametrize(("cls", "shape"), [(SimpleCNN, (3, 32, 32)), (LeNet, (1, 28, 28))])
def test_output_shapes(cls, shape):
    net = cls()
    for n in (1, 5):
        out = net(torch.randn(n, *shape))
        assert out.shape == (n, 10)
        assert out.dtype == torch.float32
    assert cls(num_classes=3)(torch.randn(2, *shape)).shape == (2, 3)


def test_layers_are_the_recipes():
    net = SimpleCNN()
    assert (net.conv1.in_channels, net.conv1.out_channels, net.conv1.kernel_size, net.conv1.padding) == (
        3,
        16,
        (3, 3),
        (1, 1),
    )
    assert (net.conv2.out_channels, net.fc.in_features) == (32, 32 * 32 * 32)
    lenet = LeNet()
    assert (lenet.conv1.out_channels, lenet.conv1.kernel_size, lenet.conv2.out_channels) == (20, (5, 5), 50)
    assert (lenet.fc1.in_features, lenet.fc1.out_features) == (800, 500)


def test_build_net_rejects_unknown_names():
    assert isinstance(build_net("lenet"), LeNet)
    with pytest.raises(ValueError, match="simple_cnn"):
        build_net("resnet")
