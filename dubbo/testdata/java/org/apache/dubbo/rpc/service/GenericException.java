package org.apache.dubbo.rpc.service;

/** Dubbo's GenericException, with the fields Java Dubbo 3.3 declares. */
public class GenericException extends RuntimeException {
    private String exceptionClass;
    private String exceptionMessage;

    public GenericException() {}

    public GenericException(String exceptionClass, String exceptionMessage) {
        super(exceptionClass + ": " + exceptionMessage);
        this.exceptionClass = exceptionClass;
        this.exceptionMessage = exceptionMessage;
    }

    public String getExceptionClass() {
        return exceptionClass;
    }

    public String getExceptionMessage() {
        return exceptionMessage;
    }
}
