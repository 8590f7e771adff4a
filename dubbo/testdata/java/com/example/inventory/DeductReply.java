package com.example.inventory;

import java.io.Serializable;

/** The demo's POJO result of deductOnce. */
public class DeductReply implements Serializable {
    private long remaining;
    private boolean duplicate;

    public DeductReply() {}

    public DeductReply(long remaining, boolean duplicate) {
        this.remaining = remaining;
        this.duplicate = duplicate;
    }

    @Override
    public String toString() {
        return "DeductReply{remaining=" + remaining + ",duplicate=" + duplicate + "}";
    }
}
