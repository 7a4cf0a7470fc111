"""Checks of the PNG plots: the file is a real image, and the figure drew what it should."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    """``path`` starts with the PNG signature and decodes to a non-empty RGB(A) image."""
    from matplotlib.image import imread

    with open(path, "rb") as handle:
        assert handle.read(8) == PNG_SIGNATURE, f"{path} is not a PNG"
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50
    assert pixels.shape[2] in (3, 4)
    return pixels.shape


def bars(ax):
    """(label, value) of each horizontal bar of an Axes, top to bottom as the labels read."""
    from matplotlib.patches import Rectangle

    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    return list(zip(labels, [r.get_width() for r in rects]))


def marked_points(ax):
    """(x, y) of the points drawn over the bars (the chosen experiment's star)."""
    return [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
