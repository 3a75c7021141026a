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


def test_widths_are_constructor_arguments_and_read_back():
    net = LeNet(channels=(10, 25), hidden=(250,))
    assert net.widths() == {"channels": [10, 25], "hidden": [250]}
    # conv1 10*1*25+10, conv2 25*10*25+25, fc1 (25*4*4)*250+250, fc2 250*10+10
    assert n_params(net) == 260 + 6_275 + 100_250 + 2_510 == 109_295
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    cnn = SimpleCNN(channels=(8, 12))
    assert cnn.widths() == {"channels": [8, 12]} and cnn.fc.in_features == 12 * 32 * 32
    assert LeNet().widths() == {"channels": [20, 50], "hidden": [500]}
    # a net rebuilt from another's widths takes its state dict strictly
    rebuilt = build_net("lenet", 10, net.widths())
    rebuilt.load_state_dict(net.state_dict(), strict=True)


@pytest.mark.parametrize(
    ("name", "widths", "message"),
    [
        ("simple_cnn", {"hidden": [10]}, "simple_cnn has no width 'hidden'"),
        ("lenet", {"channels": [0, 5]}, "model.widths.channels: needs 2 positive integer(s), got [0, 5]"),
        ("lenet", {"hidden": [10, 10]}, "model.widths.hidden: needs 1 positive integer(s)"),
    ],
)
def test_build_net_rejects_bad_widths(name, widths, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        build_net(name, 10, widths)
