import math

from troupe.platform.metrics import mean_se


def test_mean_se_hand_values():
    # mean 2.5; sample variance ((1.5)^2 + (0.5)^2 + 2^2) / 2 = 3.25; se = sqrt(3.25 / 3)
    m, se, n = mean_se([1.0, 2.0, 4.5])
    assert (m, n) == (2.5, 3)
    assert math.isclose(se, math.sqrt(3.25 / 3))
    assert mean_se(iter([3.0])) == (3.0, 0.0, 1)
    m, se, n = mean_se([])
    assert math.isnan(m) and math.isnan(se) and n == 0
