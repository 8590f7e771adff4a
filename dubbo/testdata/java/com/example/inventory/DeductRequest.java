package com.example.inventory;

import java.io.Serializable;

/** The demo's POJO argument of deductOnce. */
public class DeductRequest implements Serializable {
    private String sku;
    private int count;
    private String requestId;

    public DeductRequest() {}

    public DeductRequest(String sku, int count, String requestId) {
        this.sku = sku;
        this.count = count;
        this.requestId = requestId;
    }

    @Override
    public String toString() {
        return "DeductRequest{sku=" + sku + ",count=" + count + ",requestId=" + requestId + "}";
    }
}
