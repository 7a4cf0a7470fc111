"""Progressive layer dropping: the keep probability θ(t) = (1 − θ̄)·exp(−γ·t) + θ̄ the engine
hands the model (``progressive_layer_drop=True, pld_theta=θ``) in training forwards; it starts
at 1 and decays towards θ̄. Upstream: ``deepspeed.runtime.progressive_layer_drop``."""
import math


class ProgressiveLayerDrop:
    def __init__(self, theta=0.5, gamma=0.001):
        self.theta = theta
        self.gamma = gamma
        self.current_theta = 1.0

    def get_state(self):
        return {"progressive_layer_drop": True, "pld_theta": self.get_theta()}

    def get_theta(self):
        return self.current_theta

    def update_state(self, global_step):
        self.current_theta = (1.0 - self.theta) * math.exp(-self.gamma * global_step) + self.theta
