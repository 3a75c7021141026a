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


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_lenet_pooling_before_relu_is_the_recipes_function(memory_format):
    """LeNet.forward pools before its ReLUs (less work); outputs and every gradient equal the recipe's order."""
    torch.manual_seed(0)
    net = LeNet().to(memory_format=memory_format)
    x = torch.randn(64, 1, 28, 28).contiguous(memory_format=memory_format)
    y = torch.randint(0, 10, (64,))

    def recipe(x):
        x = net.pool(torch.relu(net.conv1(x)))
        x = net.pool(torch.relu(net.conv2(x)))
        return net.fc2(torch.relu(net.fc1(torch.flatten(x, 1))))

    outs, grads = [], []
    for forward in (net, recipe):
        net.zero_grad()
        out = forward(x)
        torch.nn.functional.cross_entropy(out, y).backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in net.parameters()])
    assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-6)
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert (grads[0][0] != 0).any()  # conv1's gradient flows


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
