"""The Focal and Dice losses of ``loss.py`` as APRIL-GAN (ByChelsea/VAND-APRIL-GAN) and AdaCLIP
(caoyunkang/AdaCLIP) both ship it, written out for the tests that check a method's loss against it."""


def their_focal(prob2, target, gamma=2.0):
    """``FocalLoss`` on softmax outputs ``(B, 2)`` or ``(B, 2, H, W)`` (apply_nonlin None, alpha None -> 1),
    without the 1e-5 label smoothing: ``mean(-(1 - p_t)^gamma log p_t)`` over every element."""
    prob = prob2.reshape(prob2.shape[0], 2, -1).permute(0, 2, 1).reshape(-1, 2)
    pt = prob.gather(1, target.reshape(-1, 1).long())[:, 0]
    return (-(1 - pt) ** gamma * pt.log()).mean()


def their_dice(prob, target):
    """``BinaryDiceLoss``: smooth 1, per image, ``1 -`` the mean over the batch."""
    n = target.shape[0]
    i, t = prob.reshape(n, -1), target.reshape(n, -1)
    return 1 - ((2 * (i * t).sum(1) + 1) / (i.sum(1) + t.sum(1) + 1)).sum() / n
